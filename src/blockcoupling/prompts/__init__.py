"""Prompt sets: built-in sets, prompt files and benchmark datasets (``hf:``)."""

from blockcoupling.prompts.sources import BUILTIN_SETS, Prompt, load_prompts, prompts_frame

__all__ = ["BUILTIN_SETS", "Prompt", "load_prompts", "prompts_frame"]
