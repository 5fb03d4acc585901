"""The Decode tab's step view: the handlers that show one step of a finished run (the
slider, Previous and Next, a click on a token, the method browsed), its folded panels and
Medusa and Clover at the same point, and the recorded run a fresh page opens with. Plain
functions of their inputs; the state is :class:`app.run_handler.RunState`.
"""
from __future__ import annotations


import gradio as gr

from app import figures, page_html, same_point, sample_run, step_panels
from app.metrics import run_stats, speedup
from app.registry import loaded_model
from app.settings import auto_tree
from clover.methods import METHOD_LABELS, split_method
from app.run_handler import (RUN_OUTPUTS, RunState, Visitor, finish_outputs, metrics_panel, outputs,
                              run_summary)



def sample_state(sample: sample_run.SampleRun, model_key: str) -> RunState:
    """The recorded run as a finished run of this page (its speeds marked recorded)."""
    return RunState(sample.method, runs=dict(sample.runs), results=dict(sample.results),
                    greedy=True, done=True, model_key=model_key, tree=auto_tree(),
                    recorded=sample.where())


def on_open(sample: sample_run.SampleRun | None, model_key: str) -> tuple:
    """A fresh page: the recorded run (:mod:`app.sample_run`) at its first step, ready
    to play; the page as built where there is none."""
    if sample is None:
        return outputs()
    st = sample_state(sample, model_key)
    shown = dict(zip(RUN_OUTPUTS, finish_outputs(st)))
    steps = st.runs[st.method]
    tree, text, metrics, status = step_view(st, st.method, 0)
    shown.update(tree=tree, text=text, metrics=metrics, status=status, banner=gr.skip(),
                 slider=gr.update(minimum=1, maximum=max(len(steps), 2), value=1,
                                  interactive=len(steps) > 1))
    return tuple(shown[n] for n in RUN_OUTPUTS)


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
    return (figures.tree_figure(steps[i], len(steps)), page_html.tokens_html(steps[: i + 1]),
            metrics_panel(st, method=method_value, upto=i + 1), step_status(st, method_value, i))


def step_status(st: RunState, method_value: str, i: int) -> str:
    """The status line while step ``i`` of ``method_value``'s trace is on display."""
    steps = st.runs[method_value]
    step = steps[i]
    drafts = len(step.accepted) - 1 if step.accepted else 0
    return (f"{run_summary(st)} Showing **{METHOD_LABELS[method_value]}**, step {i + 1} of "
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
