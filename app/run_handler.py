"""A visitor's run on the Decode tab: its state (:class:`RunState`, :class:`Visitor`, kept
in ``gr.State``), what is drawn from it (the speed cards and table, the busy note, the
panels after a run), and the Run handler (:class:`RunHandler`) that streams a live run,
drawing the page only between lockstep rounds and only when :func:`draw_due` says.
The outputs of a run are :data:`RUN_OUTPUTS`, in order.
"""
from __future__ import annotations

import logging
import statistics
import time
from contextlib import closing
from dataclasses import dataclass, field

import gradio as gr

from app import figures, page_html, runner
from app.metrics import (MIN_RATIO_STEPS, best_step, engine_ms, reference_speedups, run_stats,
                         speedup, token_origins)
from app.registry import get_model, loaded_model
from app.settings import parse_settings
from clover import TreeConfig
from clover.machine import busy
from clover.requests import NonFiniteLogitsError
from clover.methods import ALL_METHODS, METHOD_LABELS

log = logging.getLogger(__name__)


LIVE_SECONDS = 1.0  # the page is redrawn at most this often during a run


# after each redraw the next round waits this long, so the page's drawing (the server
# sending it, a browser on the same machine rendering it) never falls inside a timed step;
# on a busy machine, where such a browser draws slowly, the one redraw before the race
# goes on undrawn (draw_due) waits longer
SETTLE_SECONDS, BUSY_SETTLE_SECONDS = 0.25, 0.75


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


def _message(text: str) -> str:
    return f"**⚠ {text[0].upper() + text[1:]}**" if text else ""


def metrics_panel(state: RunState, note: str = TIMING_NOTE, method: str | None = None,
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
    return page_html.metrics_html(method, run_stats(live), vs_plain, vs_medusa, table, note,
                                warning)


def speed_card(steps: list, baseline: list | None, is_baseline: bool,
               reference: float | None, measured: str = "quiet",
               lockstep: bool = True) -> page_html.SpeedCard:
    """The speedup card of ``steps`` over ``baseline``'s run (None: it did not run): no
    ratio for the baseline itself, nor before both runs have
    :data:`app.metrics.MIN_RATIO_STEPS` steps (one step says nothing of a run's speed);
    else the ratio in state ``measured``: "quiet", "busy" (the machine was) or
    "recorded" (the recorded run, timed on another machine). ``lockstep``: the runs
    stepped in lockstep, so they are compared over the rounds both took
    (:func:`clover.trace.speedup`)."""
    if is_baseline:
        return page_html.SpeedCard(None, "self")
    if not baseline:
        return page_html.SpeedCard(None, "none", reference)
    if min(len(steps), len(baseline)) < MIN_RATIO_STEPS:
        return page_html.SpeedCard(None, "few", reference, MIN_RATIO_STEPS)
    return page_html.SpeedCard(speedup(steps, baseline, lockstep), measured, reference)


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
    if st.busy_told:  # said so already: no more drawing until the race ends
        return False
    if st.threads is not None or busy_note(st):
        st.busy_told = True
        return True
    return shown is None or time.monotonic() - shown >= LIVE_SECONDS


def _browse_choices(state: RunState) -> list[tuple[str, str]]:
    return [(METHOD_LABELS[m], m) for m in ALL_METHODS if state.runs.get(m)]


def run_summary(state: RunState, stopped: bool = False) -> str:
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
        return ((run_summary(state, stopped),) + (gr.skip(),) * 3
                + (figures.acceptance_figure(state.runs), figures.accepted_length_figure(state.runs),
                   figures.race_figure(state.runs)))
    i = best_step(steps)
    slider = gr.update(minimum=1, maximum=max(len(steps), 2), value=i + 1,
                       interactive=len(steps) > 1)
    choices = gr.update(choices=_browse_choices(state), value=browse)
    status = run_summary(state, stopped) + (f" The tree shows step {i + 1}, the longest accepted "
                                         f"path; drag the slider to revisit any step.")
    return (status, slider, choices, figures.tree_figure(steps[i], len(steps)),
            figures.acceptance_figure(state.runs), figures.accepted_length_figure(state.runs),
            figures.race_figure(state.runs))


# the outputs of a run, in order; a handler names the ones it changes (see outputs)
RUN_OUTPUTS = ("status", "banner", "metrics", "tree", "text", "plain", "slider", "browse",
               "accept", "hist", "race", "textrace", "state")


def outputs(**kw) -> tuple:
    """The run outputs: the given ones, ``gr.skip()`` for the rest."""
    return tuple(kw.get(n, gr.skip()) for n in RUN_OUTPUTS)


def _fail(message: str) -> tuple:
    gr.Warning(message[0].upper() + message[1:])
    return outputs(status=_message(message))


def finish_outputs(st: RunState, stopped: bool = False) -> tuple:
    """The outputs once a run ended (or was stopped): the panels for after a run."""
    st.done = True
    live = st.runs.get(st.method, [])
    if stopped and not any(st.runs.values()):
        return outputs(status="**■ Stopped** before the first step.", state=st)
    summary, slider, choices, tree_fig, accept, hist, race = _after_run(st, stopped)
    plain = (st.results[st.method].text if st.method in st.results
             else "".join(t.text for t in token_origins(live)))
    try:  # the banner as it stands now (the auto trees' sizing may have ended meanwhile)
        banner = loaded_model(st.model_key).notice() if st.model_key else gr.skip()
    except KeyError:  # the model was unloaded since
        banner = gr.skip()
    return outputs(status=summary, slider=slider, browse=choices, tree=tree_fig,
                accept=accept, hist=hist, race=race, metrics=metrics_panel(st), plain=plain,
                textrace=page_html.text_race_html(st.runs), banner=banner,
                text=page_html.tokens_html(live, current=best_step(live) if live else None),
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
                yield outputs(status="**■ Stopped** before it started.")
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
            yield outputs(status="Loading the model and heads…", state=st)
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
        yield outputs(status=f"Starting: the prompt's {len(prompt_ids)} tokens are read{each} "
                          f"before the first step…",
                   banner=chosen.notice(), metrics=metrics_panel(st),
                   text=page_html.tokens_html([]), plain="", state=st,
                   slider=gr.update(value=1, maximum=2, interactive=False),
                   accept=figures.empty_figure("Per-depth acceptance after a run"),
                   hist=figures.empty_figure("Tokens per step after a run"),
                   race=figures.empty_figure("The race appears after the run"),
                   textrace=page_html.text_race_html({}))
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
                        yield finish_outputs(st, stopped=True)
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
        yield finish_outputs(st)


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
        extra.update(tree=figures.tree_figure(watched[-1]), text=page_html.tokens_html(watched))
    return outputs(status=status, metrics=metrics_panel(st), state=st, **extra)
