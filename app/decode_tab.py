"""The Decode tab: settings, Run and Stop, the live tree, text and metrics of the watched
run, the step view the slider drives, and the per-depth bars, histogram and race after a
run.

Per-visitor data lives in ``gr.State`` (:class:`RunState`, :class:`Visitor`); the handlers
are plain functions of their inputs (Gradio runs them in worker threads); only Run needs
the app's model key, so it is a method of :class:`RunHandler`.
"""
from __future__ import annotations

import json
import logging
import statistics
import time
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path

import gradio as gr

from app import figures, runner, same_point, sample_run, step_panels
from app.metrics import (MIN_RATIO_STEPS, best_step, engine_ms, reference_speedups, run_stats,
                         speedup, token_origins)
from app.registry import CORE_HEAD_KINDS, LoadedModel, get_model, loaded_model
from app.settings import DEFAULT_MAX_NEW_TOKENS, MAX_NEW_TOKENS, auto_tree, parse_settings
from clover import TreeConfig
from clover.assets import assets_dir
from clover.machine import busy
from clover.requests import NonFiniteLogitsError
from clover.methods import ALL_METHODS, METHOD_LABELS, split_method

log = logging.getLogger(__name__)

EXAMPLES_FILE = "examples.json"  # under clover.assets_dir(), read when the page is built
LIVE_SECONDS = 1.0  # the page is redrawn at most this often during a run
# after each redraw the next round waits this long, so the page's drawing (the server
# sending it, a browser on the same machine rendering it) never falls inside a timed step;
# on a busy machine, where such a browser draws slowly, the one redraw before the race
# goes on undrawn (draw_due) waits longer
SETTLE_SECONDS, BUSY_SETTLE_SECONDS = 0.25, 0.75

REPLAY_JS = (Path(__file__).parent / "race_replay.js").read_text()
# after a run the race replays by itself (texts and figure) when there is one to replay
AUTO_REPLAY_JS = ("() => { if (!document.querySelector('#text-race .race-row')) return []; "
                  f"return ({REPLAY_JS})(); }}")
PLAY_JS = """() => {
  if (window._cloverPlay) { clearInterval(window._cloverPlay); window._cloverPlay = null; return []; }
  const at = () => document.querySelector('#step-slider input[type=number]');
  window._cloverPlay = setInterval(() => {
    const box = at();
    if (!box || +box.value >= +box.max) {
      clearInterval(window._cloverPlay); window._cloverPlay = null; return;
    }
    document.querySelector('#next-step').click();
  }, 900);
  return [];
}"""
# Play's timer stopped: Run, the slider, Previous and a token click pause Play
STOP_PLAY = ("if (window._cloverPlay) { clearInterval(window._cloverPlay); "
             "window._cloverPlay = null; }")
# Run stops a playing Play (it would step through the new run), and on a narrow screen
# brings the results, which sit below the settings, into view
SHOW_RESULTS_JS = (f"() => {{ {STOP_PLAY} window._cloverRan = true; "
                   "if (window.innerWidth < 800) "
                   "document.querySelector('#status')?.scrollIntoView({behavior: 'smooth', "
                   "block: 'start'}); return []; }")
# a click on a generated token asks for the step that wrote it (a "select" event whose
# index is the token's data-step); the listener sits on the panel, so it outlives redraws
TOKEN_CLICK_JS = ("element.addEventListener('click', (e) => { const t = e.target.closest("
                  f"'[data-step]'); if (t) {{ {STOP_PLAY} trigger('select', {{index: "
                  "+t.dataset.step, value: t.dataset.step}); } });")
# for the slider and Previous (Next is what Play presses)
STOP_PLAY_JS = f"(...args) => {{ {STOP_PLAY} return args; }}"
# a fresh page plays the recorded run, unless Run was pressed before it had loaded (Play
# would then step through the visitor's own run)
OPEN_PLAY_JS = f"() => {{ if (window._cloverRan) return []; return ({PLAY_JS})(); }}"
OPEN_REPLAY_JS = f"() => {{ if (window._cloverRan) return []; return ({AUTO_REPLAY_JS})(); }}"

TIMING_NOTE = ("Times are engine time: each step's draft + verify time, recorded in its trace. "
               "The methods ran in lockstep on this machine (one step of each in turn, never "
               "two at the same time), and speedups compare their tokens per second over the "
               "rounds both ran, so a change in the machine's load touches both alike; the "
               "page is drawn only between rounds, outside every timed step.")


@dataclass
class RunState:
    """One visitor's latest run (kept in ``gr.State``).

    Attributes:
        method: the method watched step by step.
        runs: per method, the step traces recorded so far.
        results: per finished method, its GenerationResult.
        greedy: whether the run was greedy (so all methods must give the same text).
        stop: the visitor pressed Stop; the run ends after its current step.
        seed / temperature: the run's sampling seed (shared by its methods) and temperature.
        done: the run finished or was stopped (the step slider is live only then).
        model_key: the registry key of the model the run used (:mod:`app.registry`).
        tree: the run's tree setting (for the speed panel: its budget, or "auto").
        threads: (torch threads used, threads before) when other processes' load made
            the run use fewer (:func:`app.runner.load_threads`), else None.
        recorded: for the recorded run a fresh page plays (:mod:`app.sample_run`), when
            and where it was recorded; None for a run made here.
        lockstep: the methods stepped in lockstep (:func:`app.runner.in_lockstep`), so
            speedups compare the rounds both runs took.
        busy_told: the machine was found busy during the run and the page said that it
            is drawn again only when the race ends (:func:`draw_due`).
    """

    method: str
    runs: dict = field(default_factory=dict)
    results: dict = field(default_factory=dict)
    greedy: bool = True
    stop: bool = False
    done: bool = False
    seed: int | None = None
    temperature: float = 0.0
    model_key: str | None = None
    tree: TreeConfig | None = None
    threads: tuple[int, int] | None = None
    recorded: str | None = None
    lockstep: bool = True
    busy_told: bool = False


@dataclass
class Visitor:
    """One browser session's Run and Stop presses (kept in ``gr.State``), so Stop also
    cancels runs still waiting in the queue.

    Attributes:
        pressed: Run presses so far.
        started: runs that left the queue so far (the n-th to start is the n-th press).
        stopped: every press up to this count was stopped.
    """

    pressed: int = 0
    started: int = 0
    stopped: int = 0


def load_examples() -> list[dict]:
    """Example prompts, one or more per task kind: [{"kind", "prompt"}, ...]."""
    return json.loads((assets_dir() / EXAMPLES_FILE).read_text(encoding="utf-8"))


def _message(text: str) -> str:
    return f"**⚠ {text[0].upper() + text[1:]}**" if text else ""


def _metrics(state: RunState, note: str = TIMING_NOTE, method: str | None = None,
             upto: int | None = None) -> str:
    """The metrics panel for the watched run (or ``method``'s, over its first ``upto``
    steps: the step view), with every measured run in a table."""
    method = method or state.method
    live = state.runs.get(method, [])[:upto]
    table = []
    plain = state.runs.get("ar")
    for m in ALL_METHODS:
        if state.runs.get(m):
            done = "done" if m in state.results else "stopped" if state.done else "running"
            ratio = (speedup(state.runs[m], plain, state.lockstep) if m != "ar" and plain
                     and min(len(state.runs[m]), len(plain)) >= MIN_RATIO_STEPS else None)
            table.append((m, run_stats(state.runs[m]), done, ratio))
    busy = busy_note(state)
    warning = busy
    if state.threads:
        warning = (f"Other processes were using the CPU, so this run decoded on "
                   f"{state.threads[0]} thread{'s' if state.threads[0] != 1 else ''} of "
                   f"{state.threads[1]} (faster on a shared machine). " + busy).strip()
    ref_plain, ref_medusa = reference_speedups(method)
    medusa = "medusa+lookup" if "medusa+lookup" in state.runs else "medusa"
    measured = "recorded" if state.recorded else "busy" if busy else "quiet"
    vs_plain = speed_card(live, state.runs.get("ar"), method == "ar", ref_plain, measured,
                          state.lockstep)
    vs_medusa = speed_card(live, state.runs.get(medusa), method == medusa, ref_medusa, measured,
                           state.lockstep)
    return figures.metrics_html(method, run_stats(live), vs_plain, vs_medusa, table, note,
                                warning)


def speed_card(steps: list, baseline: list | None, is_baseline: bool,
               reference: float | None, measured: str = "quiet",
               lockstep: bool = True) -> figures.SpeedCard:
    """The speedup card of ``steps`` over ``baseline``'s run (None: it did not run): no
    ratio for the baseline itself, nor before both runs have
    :data:`app.metrics.MIN_RATIO_STEPS` steps (one step says nothing of a run's speed);
    else the ratio in state ``measured``: "quiet", "busy" (the machine was) or
    "recorded" (the recorded run, timed on another machine). ``lockstep``: the runs
    stepped in lockstep, so they are compared over the rounds both took
    (:func:`clover.trace.speedup`)."""
    if is_baseline:
        return figures.SpeedCard(None, "self")
    if not baseline:
        return figures.SpeedCard(None, "none", reference)
    if min(len(steps), len(baseline)) < MIN_RATIO_STEPS:
        return figures.SpeedCard(None, "few", reference, MIN_RATIO_STEPS)
    return figures.SpeedCard(speedup(steps, baseline, lockstep), measured, reference)


def busy_note(state: RunState) -> str:
    """A warning when the machine was busy during the run (:func:`clover.machine.busy` of
    plain decoding's median step, engine time, against the quiet plain step the start-up
    calibration measured, :meth:`app.sizing.TreeSizing.plain_step_ms`); "" otherwise, or
    where either is unknown."""
    plain = state.runs.get("ar") or []
    if len(plain) < 3 or state.model_key is None or state.recorded:
        return ""
    try:
        quiet = loaded_model(state.model_key).sizing.plain_step_ms()
    except KeyError:  # the model was unloaded since
        return ""
    if not quiet:
        return ""
    typical = statistics.median(engine_ms(s) for s in plain)
    if not busy(typical_ms=typical, quiet_ms=quiet):
        return ""
    return (f"The machine was busy during this run: a plain step took {typical:.0f} ms here, "
            f"{quiet:.0f} ms when quiet, so these ratios are less certain (the methods ran in "
            f"lockstep, so the load fell on all of them).")


def draw_due(st: RunState, shown: float | None) -> bool:
    """Whether the page is drawn now, between two lockstep rounds (asked on the engine
    thread, :func:`app.runner.run_methods`'s ``pause``; ``shown``: when it was last drawn,
    ``time.monotonic()``): at once after Stop; at most every :data:`LIVE_SECONDS` on a
    quiet machine; on a busy one (fewer threads at the start, :func:`app.runner.load_threads`,
    or :func:`busy_note`) once to say so, then not until the race ends. Drawn beside two
    CPU hogs every 3 s, the page's speedups ran 0.95-1.19 of ``clover bench``'s: a
    browser on the same cores, woken by each redraw, takes its CPU from the steps timed
    next (``scripts/page_check.py``, docs/benchmarks.md)."""
    if st.stop:
        return True
    if st.threads is not None or busy_note(st):
        if st.busy_told:
            return False
        st.busy_told = True
        return True
    return shown is None or time.monotonic() - shown >= LIVE_SECONDS


def _browse_choices(state: RunState) -> list[tuple[str, str]]:
    return [(METHOD_LABELS[m], m) for m in ALL_METHODS if state.runs.get(m)]


def _summary(state: RunState, stopped: bool = False) -> str:
    name = METHOD_LABELS[state.method]
    live = state.runs.get(state.method, [])
    if not live:
        return "**■ Stopped** before the watched run started." if stopped else ""
    s = run_stats(live)
    head = ("**■ Stopped.**" if stopped else f"**▶ A recorded run** ({state.recorded}); "
            f"press **Run** to decode live on this machine." if state.recorded else "**✓ Done.**")
    text = (f"{head} {name} wrote {s.tokens} tokens in {s.steps} steps "
            f"({s.tokens_per_step:.2f} tokens/step, {s.tokens_per_second:.1f} tokens/s).")
    finished = {m: r for m, r in state.results.items()}
    if state.greedy and len(finished) > 1:
        same = len({tuple(r.token_ids) for r in finished.values()}) == 1
        text += (" All methods wrote exactly the same text, as greedy speculative decoding "
                 "must." if same else " ⚠ The methods' texts differ.")
    if not state.greedy:
        text += (f" Sampled at temperature {state.temperature:g} with seed **{state.seed}**: "
                 f"enter it as the seed to reproduce this run.")
    return text


def _after_run(state: RunState, stopped: bool = False) -> tuple:
    """Status, slider, browse choice, tree, acceptance bars, histogram and race after a
    run. The tree shown is the step with the longest accepted path."""
    live = state.runs.get(state.method, [])
    browse = state.method if live else next((m for m in ALL_METHODS if state.runs.get(m)), None)
    steps = state.runs.get(browse, []) if browse else []
    if not steps:
        return ((_summary(state, stopped),) + (gr.skip(),) * 3
                + (figures.acceptance_figure(state.runs), figures.accepted_length_figure(state.runs),
                   figures.race_figure(state.runs)))
    i = best_step(steps)
    slider = gr.update(minimum=1, maximum=max(len(steps), 2), value=i + 1,
                       interactive=len(steps) > 1)
    choices = gr.update(choices=_browse_choices(state), value=browse)
    status = _summary(state, stopped) + (f" The tree shows step {i + 1}, the longest accepted "
                                         f"path; drag the slider to revisit any step.")
    return (status, slider, choices, figures.tree_figure(steps[i], len(steps)),
            figures.acceptance_figure(state.runs), figures.accepted_length_figure(state.runs),
            figures.race_figure(state.runs))


def method_choices(loaded: LoadedModel) -> list[tuple[str, str]]:
    """The "Method to watch" choices (label, method): Clover, Medusa, prompt lookup and
    plain decoding, with Clover-2 after Clover when the model has Clover-2 heads."""
    extra = [(METHOD_LABELS[k], k) for k in loaded.head_kinds if k not in CORE_HEAD_KINDS]
    return [("Clover", "clover"), *extra, ("Medusa", "medusa"), ("Prompt lookup", "lookup"),
            ("Plain decoding", "ar")]


# the outputs of a run, in order; a handler names the ones it changes (see _out)
RUN_OUTPUTS = ("status", "banner", "metrics", "tree", "text", "plain", "slider", "browse",
               "accept", "hist", "race", "textrace", "state")


def _out(**kw) -> tuple:
    """The run outputs: the given ones, ``gr.skip()`` for the rest."""
    return tuple(kw.get(n, gr.skip()) for n in RUN_OUTPUTS)


def _fail(message: str) -> tuple:
    gr.Warning(message[0].upper() + message[1:])
    return _out(status=_message(message))


def _finish(st: RunState, stopped: bool = False) -> tuple:
    """The outputs once a run ended (or was stopped): the panels for after a run."""
    st.done = True
    live = st.runs.get(st.method, [])
    if stopped and not any(st.runs.values()):
        return _out(status="**■ Stopped** before the first step.", state=st)
    summary, slider, choices, tree_fig, accept, hist, race = _after_run(st, stopped)
    plain = (st.results[st.method].text if st.method in st.results
             else "".join(t.text for t in token_origins(live)))
    try:  # the banner as it stands now (the auto trees' sizing may have ended meanwhile)
        banner = loaded_model(st.model_key).notice() if st.model_key else gr.skip()
    except KeyError:  # the model was unloaded since
        banner = gr.skip()
    return _out(status=summary, slider=slider, browse=choices, tree=tree_fig,
                accept=accept, hist=hist, race=race, metrics=_metrics(st), plain=plain,
                textrace=figures.text_race_html(st.runs), banner=banner,
                text=figures.tokens_html(live, current=best_step(live) if live else None),
                state=st)


class RunHandler:
    """The Run button's handler for one app: runs decode on the model registered under
    ``model_key`` unless the visitor names another model or heads folder."""

    def __init__(self, model_key: str):
        self.model_key = model_key

    def on_run(self, prompt_text, method_value, temperature_value, max_new_value, tree_value,
               compare_value, model_value, heads_value, seed_value=None,
               lookup_value=False, visitor: Visitor | None = None):
        """Validate the settings, then stream the runs (baselines first, the watched method
        step by step), ending with the panels for after a run."""
        if visitor is not None:
            visitor.started += 1
            if visitor.started <= visitor.stopped:  # Stop was pressed while it queued
                yield _out(status="**■ Stopped** before it started.")
                return
        try:
            settings = parse_settings(prompt_text, method_value, temperature_value,
                                      max_new_value, tree_value, compare_value,
                                      model_value, heads_value, seed_value, lookup_value)
        except ValueError as e:
            yield _fail(str(e))
            return
        st = RunState(settings.method, greedy=settings.sampling.temperature == 0,
                      seed=settings.sampling.seed, temperature=settings.sampling.temperature,
                      lockstep=runner.in_lockstep())
        if settings.model or settings.heads:
            yield _out(status="Loading the model and heads…", state=st)
        try:
            chosen = get_model(settings.model, settings.heads, self.model_key)
            st.model_key, st.tree = chosen.key, settings.tree
            chosen.check_method(settings.method)
            prompt_ids = runner.encode(chosen, settings)
        except ValueError as e:
            st.done = True
            yield _fail(str(e))
            return
        order = runner.run_order(settings.method, settings.compare, settings.lookup,
                                 chosen.methods)
        each = f" by each of the {len(order)} methods" if len(order) > 1 else ""
        yield _out(status=f"Starting: the prompt's {len(prompt_ids)} tokens are read{each} "
                          f"before the first step…",
                   banner=chosen.notice(), metrics=_metrics(st),
                   text=figures.tokens_html([]), plain="", state=st,
                   slider=gr.update(value=1, maximum=2, interactive=False),
                   accept=figures.empty_figure("Per-depth acceptance after a run"),
                   hist=figures.empty_figure("Tokens per step after a run"),
                   race=figures.empty_figure("The race appears after the run"),
                   textrace=figures.text_race_html({}))
        time.sleep(SETTLE_SECONDS)  # the page draws "Starting" before the first timed step
        shown = None  # when the page was last drawn during the run
        try:
            # the page is drawn only between rounds, where draw_due says (the engine thread
            # runs the rounds between undisturbed), and the next round waits for it: page
            # work inside a timed step adds the same cost to every method's step and pushes
            # every ratio toward tokens per step (measured: a plain step 55-79 ms on the
            # page, 31 ms off it, before this rule; scripts/page_check.py)
            with runner.load_threads(chosen) as threads, \
                    closing(runner.run_methods(chosen, settings, prompt_ids,
                                               pause=lambda: draw_due(st, shown))) as events:
                st.threads = threads
                for ev in events:
                    if st.stop:  # Stop was pressed: end here, after this step
                        yield _finish(st, stopped=True)
                        return
                    _record(st, ev)
                    if ev.kind == "round":
                        yield _live_outputs(st, order, settings.max_new_tokens)
                        time.sleep(BUSY_SETTLE_SECONDS if st.busy_told else SETTLE_SECONDS)
                        shown = time.monotonic()
        except (ValueError, NonFiniteLogitsError) as e:
            st.done = True
            yield _fail(str(e))
            return
        except Exception as e:  # a message in the page, the traceback in the log
            st.done = True
            log.exception("decoding failed")
            yield _fail(f"decoding failed: {type(e).__name__}: {e}")
            return
        yield _finish(st)


def _record(st: RunState, ev: runner.RunEvent) -> None:
    """Record one :class:`app.runner.RunEvent` in ``st``."""
    if ev.kind == "start":
        st.runs[ev.method] = []
    elif ev.kind == "step":
        st.runs[ev.method].append(ev.step)
    elif ev.kind == "done":
        st.results[ev.method] = ev.result


def _race_status(st: RunState, order: list[str], max_new: int) -> str:
    """How far each method of the race is, in one line."""
    parts = []
    for m in order:
        steps = st.runs.get(m, [])
        n = steps[-1].total_tokens if steps else 0
        parts.append(f"{METHOD_LABELS[m]} {'✓' if m in st.results else f'{n}/{max_new}'}")
    return " · racing in lockstep: " + ", ".join(parts)


def _live_outputs(st: RunState, order: list[str], max_new: int) -> tuple:
    """The page during a run, drawn between lockstep rounds: status (with how far each
    method of the race is), cards, the watched method's latest tree and text. The race
    figure is drawn after the run: redrawn live it was the page's largest figure, and a
    browser on the same machine drew it into the next timed steps."""
    name = METHOD_LABELS[st.method]
    watched = st.runs.get(st.method, [])
    others = _race_status(st, order, max_new) if len(order) > 1 else ""
    extra = {}
    if st.method in st.results:
        status = f"**{name}** done in {len(watched)} steps; the others finish the race…{others}"
    elif watched:
        status = (f"**{name}** · step {len(watched)} · {watched[-1].total_tokens} of "
                  f"{max_new} tokens{others}")
    else:
        status = f"**{name}**, starting…{others}"
    if st.busy_told:
        status += (" · *The machine is busy: the page is drawn again when the race ends, so "
                   "drawing takes no CPU from the timed steps.*")
    if watched:
        extra.update(tree=figures.tree_figure(watched[-1]), text=figures.tokens_html(watched))
    return _out(status=status, metrics=_metrics(st), state=st, **extra)


def sample_state(sample: sample_run.SampleRun, model_key: str) -> RunState:
    """The recorded run as a finished run of this page (its speeds marked recorded)."""
    return RunState(sample.method, runs=dict(sample.runs), results=dict(sample.results),
                    greedy=True, done=True, model_key=model_key, tree=auto_tree(),
                    recorded=sample.where())


def on_open(sample: sample_run.SampleRun | None, model_key: str) -> tuple:
    """A fresh page: the recorded run (:mod:`app.sample_run`) at its first step, ready
    to play; the page as built where there is none."""
    if sample is None:
        return _out()
    st = sample_state(sample, model_key)
    outputs = dict(zip(RUN_OUTPUTS, _finish(st)))
    steps = st.runs[st.method]
    tree, text, metrics, status = step_view(st, st.method, 0)
    outputs.update(tree=tree, text=text, metrics=metrics, status=status, banner=gr.skip(),
                   slider=gr.update(minimum=1, maximum=max(len(steps), 2), value=1,
                                    interactive=len(steps) > 1))
    return tuple(outputs[n] for n in RUN_OUTPUTS)


def on_token(method_value, st: RunState | None, evt: gr.SelectData):
    """A click on a generated token: the step that wrote it (``evt.index``, 1-based), as
    :func:`on_step` shows a step."""
    if not st or not st.done or not st.runs.get(method_value):
        return (gr.skip(),) * 5
    i = _step_index(evt.index, st.runs[method_value])
    return (gr.update(value=i + 1),) + step_view(st, method_value, i)


def on_press(visitor: Visitor):
    """Count a Run press at once (before the run waits in the queue)."""
    visitor.pressed += 1


def on_stop(st: RunState | None, visitor: Visitor):
    """Ask the visitor's run to stop: it ends after its current step and draws the
    results itself (so nothing it sends later can overwrite them); runs still
    queued never start."""
    visitor.stopped = max(visitor.stopped, visitor.pressed)
    if st is not None and not st.done:
        st.stop = True


def step_view(st: RunState, method_value: str, i: int) -> tuple:
    """Step ``i`` of a run as one picture: its tree, the text committed up to it, the
    metrics so far and a status line naming the step on display."""
    steps = st.runs[method_value]
    return (figures.tree_figure(steps[i], len(steps)), figures.tokens_html(steps[: i + 1]),
            _metrics(st, method=method_value, upto=i + 1), step_status(st, method_value, i))


def step_status(st: RunState, method_value: str, i: int) -> str:
    """The status line while step ``i`` of ``method_value``'s trace is on display."""
    steps = st.runs[method_value]
    step = steps[i]
    drafts = len(step.accepted) - 1 if step.accepted else 0
    return (f"{_summary(st)} Showing **{METHOD_LABELS[method_value]}**, step {i + 1} of "
            f"{len(steps)}: {drafts} drafted token{'s' if drafts != 1 else ''} accepted, "
            f"{len(step.new_tokens)} committed.")


def on_browse(step_number, method_value, st: RunState | None):
    """The step view of step ``step_number`` (1-based) of ``method_value``'s trace."""
    if not st or not st.done or not st.runs.get(method_value):
        return gr.skip(), gr.skip(), gr.skip(), gr.skip()
    return step_view(st, method_value, _step_index(step_number, st.runs[method_value]))


def _step_index(step_number, steps: list, delta: int = 0) -> int:
    """The 0-based index of step ``step_number`` (1-based, as the slider shows it; empty
    means 1) moved by ``delta``, kept within ``steps``."""
    return min(max(int(step_number or 1) + delta, 1), len(steps)) - 1


PANEL_TITLES = {  # the step view's folded panels, in order
    "verify": "Verify: what the target wanted at each drafted token",
    "mask": "The tree attention mask and position ids",
    "kv": "Update: what the KV cache kept",
    "regressive": "Clover's regressive inputs, per depth",
    "speed": "Why this fast, here: the verify cost curve",
    "time": "Where a step's time goes: drafting, verifying, and the break-even",
}


def speed_facts(st: RunState, method_value: str, steps: list) -> step_panels.SpeedFacts:
    """What the speed panel reads for ``method_value``'s first ``len(steps)`` steps: the
    model's verify cost curve where already measured (never measured here), the tree
    budget the run used, and the run's measured tokens per step and speedup."""
    try:
        loaded = loaded_model(st.model_key)
    except KeyError:  # the model was unloaded since (another visitor's models)
        loaded = None
    kind = split_method(method_value)[0]
    tree, auto = st.tree, bool(st.tree and st.tree.auto)
    if auto and loaded is not None and kind is not None:
        tree = loaded.sizing.auto_trees.get(kind, tree)
    budget = tree.budget if kind is not None and tree is not None and not tree.off else None
    return step_panels.SpeedFacts(
        costs=loaded.sizing.measured_verify_costs() if loaded is not None else None,
        budget=budget, auto=auto, device=loaded.target.device.type if loaded else "cpu",
        tokens_per_step=run_stats(steps).tokens_per_step,
        verified_per_step=sum(len(s.nodes) for s in steps) / len(steps),
        measured=(speedup(steps, st.runs.get("ar", []), st.lockstep)
                  if method_value != "ar" else None),
        draft_ms=run_stats(steps).draft_ms)


def step_panels_view(st: RunState, method_value: str, i: int) -> tuple:
    """The panels of step ``i``: verify table, attention mask, KV-cache update,
    regressive inputs, cost curve, where the runs' step time goes (whole runs) and the
    cost curve's reading, all from the traces; then
    Clover's and Medusa's trees from the same text and what differs
    (:func:`same_point_view`)."""
    steps = st.runs[method_value]
    step = steps[i]
    facts = speed_facts(st, method_value, steps[: i + 1])
    return (step_panels.verify_figure(step, st.greedy), step_panels.mask_figure(step),
            step_panels.kv_figure(step), step_panels.regressive_figure(step, method_value),
            step_panels.speed_figure(facts), step_panels.time_figure(method_value, st.runs),
            step_panels.speed_reading(facts), *same_point_view(st, method_value, i))


SAME_POINT_CAPTION = (
    "Both methods' trees from the same committed text. Medusa's heads all guess from one "
    "hidden state; Clover's heads also read the token drafted just before theirs (the "
    "Regressive Connection), so its deeper drafts follow its own earlier ones.")


def same_point_view(st: RunState, method_value: str, i: int) -> tuple:
    """Clover's and Medusa's trees from the same text as step ``i`` of ``method_value``'s
    trace (:func:`app.same_point.same_point`) and the sentence on what differs; notes
    where the run has no pair to show."""
    point = same_point.same_point(st.runs, method_value, i)
    if point is None:
        note = figures.empty_figure("Turn on Compare (or run Clover and Medusa) to see both "
                                    "trees from the same text", height=140)
        return note, note, ""
    figs = []
    for m, k in ((point.clover, point.clover_step), (point.medusa, point.medusa_step)):
        steps = st.runs[m]
        fig = figures.tree_figure(steps[k], len(steps))
        step = steps[k]
        # a title short enough for half a desktop row and a phone alike
        fig.update_layout(title_text=f"<b>{METHOD_LABELS[m]}</b>, step {k + 1}: "
                                     f"{len(step.accepted) - 1} of {len(step.nodes) - 1} "
                                     f"drafts accepted")
        figs.append(fig)
    return figs[0], figs[1], same_point.describe(point, st.runs)


def on_step(delta: int, step_number, method_value, st: RunState | None):
    """Previous (``delta`` -1) or next (+1) step of ``method_value``'s trace, kept within
    the trace: the slider's new value, then the step view of :func:`step_view`."""
    if not st or not st.done or not st.runs.get(method_value):
        return (gr.skip(),) * 5
    i = _step_index(step_number, st.runs[method_value], delta)
    return (gr.update(value=i + 1),) + step_view(st, method_value, i)


def on_previous(step_number, method_value, st: RunState | None):
    """The Previous button: :func:`on_step` one back."""
    return on_step(-1, step_number, method_value, st)


def on_next(step_number, method_value, st: RunState | None):
    """The Next button (and each tick of Play): :func:`on_step` one on."""
    return on_step(1, step_number, method_value, st)


def on_step_panels(step_number, method_value, st: RunState | None):
    """The step panels of the step the slider shows (after a run: the step the tree shows)."""
    if not st or not st.done or not st.runs.get(method_value):
        return (gr.skip(),) * (len(PANEL_TITLES) + 4)
    return step_panels_view(st, method_value, _step_index(step_number, st.runs[method_value]))


def on_pick_trace_panels(method_value, st: RunState | None):
    """The step panels of another method's trace (its last step, as :func:`on_pick_trace`)."""
    return on_step_panels(len(st.runs.get(method_value, [])) if st else 1, method_value, st)


def on_pick_trace(method_value, st: RunState | None):
    """Show another method's trace: the slider spans its steps, the view its last step."""
    if not st or not st.done or not st.runs.get(method_value):
        return (gr.skip(),) * 5
    steps = st.runs[method_value]
    return (gr.update(minimum=1, maximum=max(len(steps), 2), value=len(steps),
                      interactive=len(steps) > 1),) + step_view(st, method_value, len(steps) - 1)


def page_sample(loaded: LoadedModel, examples: list[dict]) -> sample_run.SampleRun | None:
    """The recorded run a fresh page plays: the shipped one where it was recorded with
    this model and heads on the first example's prompt, else None (a damaged file is
    logged and skipped: the page works without it)."""
    try:
        sample = sample_run.load()
    except ValueError:
        log.warning("the recorded run is not shown", exc_info=True)
        return None
    if (sample is None or not examples or sample.prompt != examples[0]["prompt"]
            or sample.method not in sample.runs or not sample.fits(loaded)):
        return None
    return sample


def build(demo: gr.Blocks, loaded: LoadedModel, model_key: str, banner: gr.Markdown) -> None:
    """Lay out the Decode tab inside the current ``gr.Tab`` and wire its events.

    Args:
        demo: the page (a fresh page opens on the recorded run, :func:`on_open`).
        loaded: the app's default model (its methods and name fill the settings).
        model_key: its registry key (:func:`app.registry.register_model`).
        banner: the page's model notice, updated when a run loads another model.
    """
    examples = load_examples()
    sample = page_sample(loaded, examples)
    state = gr.State(None, time_to_live=3600)  # a visitor's traces, freed after an hour
    visitor = gr.State(Visitor())  # a copy per browser session
    with gr.Row(equal_height=False):
        with gr.Column(scale=4, min_width=330):
            prompt = gr.Textbox(
                examples[0]["prompt"] if examples else "", label="Prompt", lines=4,
                max_lines=14, elem_id="prompt",
                placeholder="Ask something, or pick an example below. For a "
                            "multi-turn chat write 'User: ...' / 'Assistant: ...' lines.")
            # right under the prompt, above every setting: one per task kind
            gr.Examples(examples=[[e["prompt"]] for e in examples], inputs=[prompt],
                        example_labels=[e["kind"] for e in examples],
                        label="Examples: one per task kind", examples_per_page=len(examples),
                        elem_id="examples")
            with gr.Row():
                run_btn = gr.Button("Run", variant="primary", elem_id="run-button")
                stop_btn = gr.Button("Stop", variant="stop", elem_id="stop-button")
            method = gr.Radio(method_choices(loaded), value="clover",
                              label="Method to watch", elem_id="method")
            lookup = gr.Checkbox(
                value=False, label="Add a prompt lookup branch to the heads' tree",
                elem_id="lookup",
                info="Medusa and Clover also draft what followed the last words "
                     "earlier in the prompt or answer (no training), in the same "
                     "tree, sized each step to what pays on this machine; "
                     "ringed nodes came from lookup.")
            temperature = gr.Slider(0.0, 2.0, value=0.0, step=0.05, label="Temperature",
                                    info="0 = greedy; above 0 = lossless speculative "
                                         "sampling")
            # a text box: a number box shows (and sends) 0 when empty, so every "random"
            # run would have been seed 0
            seed = gr.Textbox("", label="Seed", elem_id="seed", placeholder="random",
                              max_lines=1, info="for sampling; empty = a new random seed "
                                                "per run (shown after the run, to reproduce it)")
            max_new = gr.Number(value=DEFAULT_MAX_NEW_TOKENS, label="Max new tokens",
                                elem_id="max-new-tokens",
                                info=f"1 to {MAX_NEW_TOKENS}")
            tree = gr.Dropdown(
                ["auto", "4", "6", "10", "16", "24", "32"], value="auto",
                allow_custom_value=True, label="Tree budget (drafted tokens per step)",
                elem_id="tree-budget",
                info="auto (sized to this machine at start-up; the smallest tree where "
                     "no tree beats plain decoding here), a number, off, or a spec: "
                     "dynamic:budget=12,branching=4 · small · [[0],[1],[0,0]]")
            compare = gr.Checkbox(
                value=True, label="Compare with the other methods",
                info="Races plain decoding, prompt lookup and the other head types "
                     "alongside, one step of each in turn, for the speedups and the race.")
            with gr.Accordion("Model and heads", open=False):
                model_box = gr.Textbox(
                    "", label="Model: hub id or local folder",
                    placeholder=f"empty = {loaded.label}")
                heads_box = gr.Textbox(
                    "", label="Heads folder",
                    placeholder="empty = the model's shipped heads, else untrained heads",
                    info="A folder saved by save_pretrained, or one with medusa/, "
                         "clover/ and clover2/ subfolders.")
        with gr.Column(scale=7, min_width=480):
            status = gr.Markdown("Press **Run** to decode the prompt, or pick another example first.",
                                 elem_id="status")
            before = figures.SpeedCard(None, "before")
            metrics = gr.HTML(figures.metrics_html(
                "clover", run_stats([]), before, before, (), TIMING_NOTE),
                elem_id="metrics-panel")
            tree_plot = gr.Plot(figures.empty_figure(
                "The candidate tree of each step appears here"),
                show_label=False, elem_id="tree-plot")
            with gr.Row():
                step_slider = gr.Slider(1, 2, value=1, step=1, label="Revisit a step",
                                        interactive=False, elem_id="step-slider",
                                        scale=3)
                browse = gr.Radio([], label="Trace of", elem_id="browse", scale=2)
            with gr.Row():
                prev_btn = gr.Button("◀ Previous", size="sm", elem_id="previous-step")
                play_btn = gr.Button("▶ Play the steps", size="sm", elem_id="play-steps")
                next_btn = gr.Button("Next ▶", size="sm", elem_id="next-step")
            text = gr.HTML(figures.tokens_html([]), elem_id="text-panel",
                           js_on_load=TOKEN_CLICK_JS)
            with gr.Accordion("The generated text, to copy", open=False):
                plain_text = gr.Textbox(show_label=False, lines=4, interactive=False,
                                        buttons=["copy"], elem_id="plain-text")
            with gr.Accordion("Clover and Medusa from the same text", open=True,
                              elem_id="panel-same-point"):
                gr.Markdown(SAME_POINT_CAPTION, elem_classes="panel-caption")
                with gr.Row(equal_height=False):
                    waiting = figures.empty_figure("After a run: both methods' trees from "
                                                   "the same text", height=140)
                    same_clover = gr.Plot(waiting, show_label=False, min_width=300,
                                          elem_id="same-point-clover")
                    same_medusa = gr.Plot(waiting, show_label=False, min_width=300,
                                          elem_id="same-point-medusa")
                same_text = gr.Markdown("", elem_id="same-point-text")
            panels = {}
            for name, title in PANEL_TITLES.items():
                with gr.Accordion(title, open=False, elem_id=f"panel-{name}"):
                    gr.Markdown(step_panels.CAPTIONS[name], elem_classes="panel-caption")
                    panels[name] = gr.Plot(figures.empty_figure(
                        "Run a prompt, then pick a step with the slider", height=140),
                        show_label=False, elem_id=f"{name}-plot")
                    if name == "speed":
                        speed_text = gr.Markdown("", elem_id="speed-reading")
    with gr.Row():
        accept_plot = gr.Plot(figures.empty_figure("Per-depth acceptance after a run"),
                              show_label=False, elem_id="acceptance-plot")
        hist_plot = gr.Plot(figures.empty_figure("Tokens per step after a run"),
                            show_label=False, elem_id="histogram-plot")
    text_race = gr.HTML(figures.text_race_html({}), elem_id="text-race-panel")
    race_plot = gr.Plot(figures.empty_figure("The race of plain, Medusa and Clover "
                                             "after a run"),
                        show_label=False, elem_id="race-plot")
    replay_btn = gr.Button("▶ Replay the race", elem_id="replay-button", size="md")

    outputs = dict(status=status, banner=banner, metrics=metrics, tree=tree_plot, text=text,
                   plain=plain_text, slider=step_slider, browse=browse, accept=accept_plot,
                   hist=hist_plot, race=race_plot, textrace=text_race, state=state)
    run_outputs = [outputs[n] for n in RUN_OUTPUTS]
    run_inputs = [prompt, method, temperature, max_new, tree, compare, model_box, heads_box, seed,
                  lookup]
    on_run = RunHandler(model_key).on_run
    # the step view's folded panels, then both trees from the same text
    panel_outputs = [*panels.values(), speed_text, same_clover, same_medusa, same_text]
    # a press is counted at once, then the run waits its turn in the queue. Every press
    # and its run are accepted (trigger_mode "multiple" on each link of the chain): with
    # Gradio's default ("once") the run of a press made while another run is pending is
    # dropped after the press was counted, and Stop's bookkeeping, which cancels the
    # presses counted so far, would then cancel the next real run
    # on a narrow screen the results sit below the settings: bring them into view
    for trigger in (run_btn.click, prompt.submit):
        trigger(None, js=SHOW_RESULTS_JS, api_visibility="private")
    for trigger, api in ((run_btn.click, dict(api_name="run")),
                         (prompt.submit, dict(api_visibility="private"))):
        trigger(on_press, [visitor], None, api_visibility="private", concurrency_limit=None,
                show_progress="hidden", trigger_mode="multiple").then(
            on_run, run_inputs + [visitor], run_outputs, concurrency_limit=1,
            concurrency_id="decode", show_progress="hidden", trigger_mode="multiple", **api).then(
            None, js=AUTO_REPLAY_JS, api_visibility="private").then(
            on_step_panels, [step_slider, browse, state], panel_outputs,
            api_visibility="private", concurrency_limit=None, show_progress="hidden",
            trigger_mode="multiple")
    # Stop is cooperative: the run checks the flag between steps (at most one step away)
    # and draws its own final state; a queued run never starts; closing the page still
    # cancels the run outright.
    stop_btn.click(on_stop, [state, visitor], None, api_visibility="private",
                   concurrency_limit=None, show_progress="hidden")
    step_slider.input(on_browse, [step_slider, browse, state], [tree_plot, text, metrics, status],
                      api_visibility="private", concurrency_limit=None,
                      show_progress="hidden", trigger_mode="always_last", js=STOP_PLAY_JS)
    for button, fn in ((prev_btn, on_previous), (next_btn, on_next)):
        button.click(fn, [step_slider, browse, state],
                     [step_slider, tree_plot, text, metrics, status], api_visibility="private",
                     concurrency_limit=None, show_progress="hidden",
                     js=STOP_PLAY_JS if button is prev_btn else None).then(
            on_step_panels, [step_slider, browse, state], panel_outputs,
            api_visibility="private", concurrency_limit=None, show_progress="hidden")
    # Play presses Next every 0.9 s until the last step (a second press pauses)
    play_btn.click(None, js=PLAY_JS)
    # a click on a token of the text brings the step that wrote it
    text.select(on_token, [browse, state], [step_slider, tree_plot, text, metrics, status],
                api_visibility="private", concurrency_limit=None, show_progress="hidden").then(
        on_step_panels, [step_slider, browse, state], panel_outputs,
        api_visibility="private", concurrency_limit=None, show_progress="hidden")
    # a fresh page opens on the recorded run, its tree playing step by step and its
    # texts racing, before any press
    if sample is not None:
        def open_page():
            return on_open(sample, model_key)

        demo.load(open_page, None, run_outputs,
                  api_visibility="private", concurrency_limit=None,
                  show_progress="hidden").then(
            on_step_panels, [step_slider, browse, state], panel_outputs,
            api_visibility="private", concurrency_limit=None, show_progress="hidden").then(
            None, js=OPEN_PLAY_JS, api_visibility="private").then(
            None, js=OPEN_REPLAY_JS, api_visibility="private")
    browse.input(on_pick_trace, [browse, state], [step_slider, tree_plot, text, metrics, status],
                 api_visibility="private", concurrency_limit=None, show_progress="hidden")
    # the step panels follow the step view, as separate events so the tree never waits
    # for them
    step_slider.input(on_step_panels, [step_slider, browse, state], panel_outputs,
                      api_visibility="private", concurrency_limit=None,
                      show_progress="hidden", trigger_mode="always_last")
    browse.input(on_pick_trace_panels, [browse, state], panel_outputs, api_visibility="private",
                 concurrency_limit=None, show_progress="hidden")
    # the replay is drawn in the browser from the timelines the race figure carries: no
    # server work per frame, so replays never slow other visitors' runs
    replay_btn.click(None, js=REPLAY_JS)
