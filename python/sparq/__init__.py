"""sparq: Python bindings (ctypes) for libsparq, CPU inference for GGUF
models with sparse attention (SparQ, top-k over a key index).

Low level, mirroring include/sparq.h: Model, Context, Sampler, AttnParams,
attn_run (include/sparq_attn.h). High level, shaped like llama-cpp-python:
Llama. Errors raise SparqError with the library's message.
"""
from ._lib import SparqABIError, SparqError
from .core import (AttnParams, Context, Model, Sampler, attn_run, cpu_level, find_model, gguf_metadata,
                   import_llama_state, ratio_params, version)
from .llama import Llama, LlamaState, LlamaTokenizer

__version__ = "0.1.0"
__all__ = ["AttnParams", "Context", "Llama", "LlamaState", "LlamaTokenizer", "Model", "Sampler",
           "SparqABIError", "SparqError", "attn_run", "cpu_level", "find_model", "gguf_metadata", "import_llama_state",
           "ratio_params",
           "version"]
