"""Loading transformer models the same way for every stage (embedder, highlighter).

A model is a hub id or a local directory. Only safetensors weights are ever read
(never pickles), ``trust_remote_code`` is off unless asked for, and the weights get a
content fingerprint that run manifests and span rows record as the model revision.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
from pathlib import Path

# Files fetched for a hub model: configs, tokenizer files and safetensors; never pickles.
HUB_PATTERNS = ["*.json", "*.safetensors", "*.txt", "*.model", "*.tiktoken", "*.py"]
# Weights up to this size are hashed whole; larger ones are sampled (see fingerprint).
FULL_HASH_BYTES = 1 << 30


def resolve_device(device: str):
    """``auto`` means CUDA when available, else CPU."""
    import torch

    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def resolve_dtype(dtype: str, device):
    """``auto``: bfloat16 on CUDA (float16 where bf16 is unsupported), float32 on CPU."""
    import torch

    if dtype == "auto":
        if device.type == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.float32
    return getattr(torch, dtype)


def resolve_model_dir(model: str, revision: str | None = None, what: str = "model") -> Path:
    """A local directory as is, else a hub snapshot (configs, tokenizer, safetensors only)."""
    path = os.path.expanduser(model)
    if os.path.isdir(path):
        return Path(path)
    if path.startswith(("/", ".", "~")) or path.count("/") > 1 or os.path.exists(path):
        raise FileNotFoundError(f"{what} directory not found: {model}")
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(repo_id=path, revision=revision, allow_patterns=HUB_PATTERNS))
    except Exception as exc:  # offline, unknown repo, no network: say which model and why
        raise FileNotFoundError(
            f"cannot fetch {what} {model!r} (revision {revision!r}) from the hub or its cache: {exc}"
        ) from exc


def safetensors_files(weights_dir: Path) -> list[Path]:
    """The safetensors files of a model directory; a clear error when there are only pickles."""
    files = sorted(Path(weights_dir).glob("*.safetensors"))
    if not files:
        others = sorted(p.name for p in Path(weights_dir).iterdir() if p.suffix in (".bin", ".pt", ".pth", ".ckpt"))
        hint = f" (found {', '.join(others)}; pickle checkpoints are never loaded)" if others else ""
        raise FileNotFoundError(
            f"no safetensors weights (*.safetensors) in {weights_dir}{hint}: convert the model to safetensors first"
        )
    return files


def fingerprint(files: list[Path]) -> str:
    """sha256 over safetensors files: whole bytes when small (< 1 GiB), else header + sampled blocks + size.

    Either way it changes whenever any tensor's dtype, shape or offset changes, and it
    samples values; a 150M-parameter model hashes in well under a second.
    """
    h = hashlib.sha256()
    total = sum(f.stat().st_size for f in files)
    full = total <= FULL_HASH_BYTES
    for f in files:
        size = f.stat().st_size
        h.update(f.name.encode() + b"\0" + str(size).encode() + b"\0")
        with open(f, "rb") as fh:
            if full:
                for block in iter(lambda: fh.read(1 << 22), b""):
                    h.update(block)
            else:
                header_len = int.from_bytes(fh.read(8), "little")
                h.update(fh.read(min(header_len, 100 << 20)))
                for k in range(64):
                    fh.seek(size * k // 64)
                    h.update(fh.read(1 << 16))
    return ("sha256:" if full else "sha256-sampled:") + h.hexdigest()[:32]


def dtype_kwarg() -> str:
    """``from_pretrained``'s dtype keyword (``dtype`` since transformers 4.56, ``torch_dtype`` before)."""
    import transformers
    from packaging.version import Version

    return "dtype" if Version(transformers.__version__.split("+")[0]) >= Version("4.56") else "torch_dtype"


def load_model(model_cls, weights_dir: Path, *, device, torch_dtype, attn_implementation: str = "auto",
               trust_remote_code: bool = False, **kwargs):
    """``model_cls.from_pretrained`` with the best attention available; returns ``(model, attn)``.

    ``auto`` tries flash-attention 2 (CUDA, half precision, when installed), then SDPA,
    then the model's default. Extra ``kwargs`` go to ``from_pretrained`` (e.g. ``config``).
    """
    import torch

    if attn_implementation != "auto":
        candidates = [attn_implementation]
    else:
        candidates = ["sdpa", None]
        if (device.type == "cuda" and torch_dtype in (torch.bfloat16, torch.float16)
                and importlib.util.find_spec("flash_attn") is not None):
            candidates.insert(0, "flash_attention_2")
    errors = []
    for attn in candidates:
        kw = dict(use_safetensors=True, trust_remote_code=trust_remote_code, **kwargs)
        kw[dtype_kwarg()] = torch_dtype
        if attn is not None:
            kw["attn_implementation"] = attn
        try:
            model = model_cls.from_pretrained(str(weights_dir), **kw)
        except (ValueError, ImportError) as exc:
            if attn_implementation != "auto":
                raise
            errors.append(f"{attn}: {exc}")
            continue
        model.to(device)
        return model, getattr(model.config, "_attn_implementation", attn) or "eager"
    raise ValueError(f"could not load {weights_dir}: " + "; ".join(errors))
