"""How much the libraries blockcoupling drives say: the CLI's ``-q`` / ``-v`` passed on to
transformers and huggingface_hub (logging, model-loading and download bars) and to Ray
(``ray.init``'s logging level). Quiet hides progress and chatter, never results or errors.

Nothing heavy is imported here: a library not imported yet reads the environment variables
set here when it is; one already imported is told directly.
"""

from __future__ import annotations

import logging
import os
import sys

_RAY_LEVEL = {"quiet": "ERROR", "normal": "WARNING", "verbose": "INFO"}
_state = {"level": "normal"}


def set_verbosity(*, quiet: bool = False, verbose: bool = False, terminal: bool = True) -> None:
    """``quiet``: only errors from transformers, huggingface_hub, Ray and torch's import-time
    notices, no progress bars;
    ``verbose``: their info messages too; neither: their defaults (as blockcoupling sets
    them). Their progress bars (model loading, saving, downloads) show on a terminal only:
    ``terminal=False`` (the CLI passes whether stderr is one) turns them off, as the project's
    own progress turns into plain lines there. Environment variables the user set are kept unless a flag asks
    otherwise."""
    level = "verbose" if verbose else "quiet" if quiet else "normal"
    _state["level"] = level
    if level == "quiet":
        os.environ["TRANSFORMERS_VERBOSITY"] = "error"
        os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    elif level == "verbose":
        os.environ["TRANSFORMERS_VERBOSITY"] = "info"
    if level != "normal" and "transformers" in sys.modules:
        from transformers.utils import logging as hf_logging

        if level == "quiet":
            hf_logging.set_verbosity_error()
        else:
            hf_logging.set_verbosity_info()
    if level != "quiet" and not terminal:  # a log file gets no bars (\r, cursor codes)
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # what the user set stays
    bars = os.environ.get("HF_HUB_DISABLE_PROGRESS_BARS", "") not in ("1", "true", "yes", "on")
    if not bars and "transformers" in sys.modules:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    if not bars and "huggingface_hub" in sys.modules:
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()
    if "ray" in sys.modules:
        logging.getLogger("ray").setLevel(ray_logging_level())
    # import-time notices of torchao (which transformers imports where it is installed): its
    # GPU kernels that a CPU build cannot load, and torch's note on the enums it registers
    for name in ("torchao", "torch.utils._pytree"):
        logging.getLogger(name).setLevel(logging.ERROR if level == "quiet" else logging.NOTSET)


def quiet() -> bool:
    """Whether ``-q`` was given."""
    return _state["level"] == "quiet"


def ray_logging_level() -> str:
    """``ray.init(logging_level=...)``: ERROR with ``-q``, INFO with ``-v``, else WARNING."""
    return _RAY_LEVEL[_state["level"]]
