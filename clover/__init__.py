"""Clover Studio: Clover and Medusa speculative decoding on transformers causal LMs.

Data flows one way: prompt -> tokenizer -> :class:`~clover.engine.Engine` (draft ->
verify -> accept -> cache update) -> :class:`~clover.trace.StepTrace` records -> CLI,
app, benchmark, notebooks. Importing this package does no work and needs no Gradio.
"""
from dataclasses import replace

from clover.acceptance import SamplingConfig
from clover.assets import assets_dir
from clover.engine import Engine
from clover.calibration import calibrator_for, resolve_tree
from clover.heads import HeadConfig, heads_for, load_heads, new_heads
from clover.lookup import LookupConfig
from clover.methods import ALL_METHODS, split_method
from clover.models import TargetModel, encode_prompt, load_target
from clover.trace import GenerationResult, StepTrace, TreeNode
from clover.tree import TreeConfig, parse_tree_spec

__all__ = ["Engine", "engine_for", "ALL_METHODS", "LookupConfig", "SamplingConfig", "TreeConfig",
           "parse_tree_spec", "HeadConfig", "load_heads", "new_heads", "TargetModel", "load_target",
           "encode_prompt", "GenerationResult", "StepTrace", "TreeNode", "assets_dir"]


def engine_for(method: str, target, tree=None, heads_dir: str | None = None, num_heads: int = 3,
               lookup=None, *, recalibrate: bool = False, batch_size: int = 1, pad_verify: bool = False,
               progress=None):
    """The :class:`~clover.engine.Engine` of a method by name, ready to run: the heads
    :func:`clover.heads.heads_for` picks (``heads_dir``, else the shipped heads for this
    target, else fresh ones) and the tree setting resolved for this machine by
    :func:`clover.calibration.resolve_tree` ("auto": the stored budget, else measured and
    stored, seconds on a CPU).

    Args:
        method: one of :data:`ALL_METHODS`.
        tree: a ``TreeConfig`` for the head methods (default ``TreeConfig()``), "auto" or not.
        lookup: the ``LookupConfig`` when the method uses lookup (default ``LookupConfig()``).
        recalibrate: measure the auto tree again even where one is stored.
        batch_size: size an "auto" tree for batches of this many rows.
        pad_verify: pad each one-row step's verification to the width this machine runs
            fastest (:func:`clover.calibration.verify_widths`, measured once per target:
            seconds on a CPU); the text is unchanged. A lookup chain sized by the verify
            cost curve is then sized by the padded steps' costs.
        progress: follows an auto tree's measurement, ``progress(what, done, total)``
            (:func:`clover.autotree.auto_tree`).
    Raises:
        ValueError: unknown method, heads that do not fit.
    """
    kind, uses_lookup = split_method(method)
    heads = heads_for(kind, target, heads_dir, num_heads)[0] if kind else None
    tree, lookup = resolve_tree(target, heads, tree, (lookup or LookupConfig()) if uses_lookup else None,
                                recalibrate=recalibrate, batch_size=batch_size, progress=progress)
    engine = Engine(target, heads, tree, lookup)
    if pad_verify:  # the plan covers the most tokens this engine's steps verify
        widths, costs = calibrator_for(target).verify_plan(engine.max_step_tokens)
        if lookup is not None and lookup.costs:  # chains sized by what a padded step costs
            lookup = replace(lookup, costs=tuple(costs[: len(lookup.costs)]))
        engine = Engine(target, heads, tree, lookup, widths)
    return engine
