"""The data path of head training: prompts -> target answers -> hidden states -> heads.

* :mod:`clover.training.prompts`: prompt sources (templated, ShareGPT human turns,
  self-generated Magpie prompts) and the overlap filter against benchmark prompts.
* :mod:`clover.training.batchgen`: the target's answers at several times single-stream
  speed: plain decoding through the engine's loop with continuous batching
  (:meth:`clover.engine.Engine.serve`).
* :mod:`clover.training.data`: self-distillation folders (``clover data``) and
  forward-labelled text (``clover text-data``); batching of records.
* :mod:`clover.training.hidden_cache`: the frozen target's hidden states, computed once.
* :mod:`clover.training.train`: the training loop (``clover train``).

Nothing in the decoding engine imports this package.
"""
