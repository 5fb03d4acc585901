"""Clover Studio: Clover and Medusa speculative decoding on transformers causal LMs.

Data flows one way: prompt -> tokenizer -> :class:`~clover.engine.Engine` (draft ->
verify -> accept -> cache update) -> :class:`~clover.trace.StepTrace` records -> CLI,
app, benchmark, notebooks. Importing this package does no work and needs no Gradio.
"""
from clover.acceptance import SamplingConfig
from clover.assets import assets_dir
from clover.engine import Engine
from clover.heads import HeadConfig, load_heads, new_heads
from clover.lookup import LookupConfig
from clover.methods import ALL_METHODS, engine_for
from clover.models import TargetModel, encode_prompt, load_target
from clover.trace import GenerationResult, StepTrace, TreeNode
from clover.tree import TreeConfig, parse_tree_spec

__all__ = ["Engine", "engine_for", "ALL_METHODS", "LookupConfig", "SamplingConfig", "TreeConfig",
           "parse_tree_spec", "HeadConfig", "load_heads", "new_heads", "TargetModel", "load_target",
           "encode_prompt", "GenerationResult", "StepTrace", "TreeNode", "assets_dir"]
