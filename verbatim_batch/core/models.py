"""Loading transformer models the same way for every stage (embedder, highlighter).

A model is a hub id or a local directory. Only safetensors weights are read (never pickles), ``trust_remote_code``
is off unless asked for, and the weights get a content fingerprint recorded as the model revision. A model folder
is input like any other, checked before anything is allocated (``check_model_dir``): ``config.json`` and its sizes
within sane limits, held by the weights and fitting the memory at hand; each safetensors header inside its file;
the tokenizer files parsed and consistent with the vocabulary. A folder that fails is one ``ValueError`` line.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import math
import os
import struct
from functools import lru_cache
from pathlib import Path

# Files fetched for a hub model: configs, tokenizer files and safetensors; never pickles.
HUB_PATTERNS = ["*.json", "*.safetensors", "*.txt", "*.model", "*.tiktoken", "*.py"]
# Weights up to this size are hashed whole; larger ones are sampled (see fingerprint).
FULL_HASH_BYTES = 1 << 30
MAX_CONFIG_BYTES = 4 << 20  # a config.json is kilobytes (a long label map: some hundred)
MAX_HEADER_BYTES = 100 << 20  # the safetensors format's own bound on a header
MAX_TOKENIZER_BYTES = 256 << 20  # tokenizer.json of a 250k vocabulary: about 20 MB
# Sizes a config may give (a value over one is not a model this tool can load: 100,000 layers, a 2^40 vocabulary).
CONFIG_LIMITS = {"num_hidden_layers": 1_024, "num_layers": 1_024, "n_layer": 1_024, "hidden_size": 65_536,
                 "d_model": 65_536, "n_embd": 65_536, "intermediate_size": 1 << 20, "num_attention_heads": 1_024,
                 "vocab_size": 4_000_000, "max_position_embeddings": 1 << 22, "type_vocab_size": 1_024,
                 "num_labels": 1 << 16}
_DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1,
                "U16": 2, "U32": 4, "U64": 8, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1, "C64": 8}
NO_MEMORY_CHECK = "VERBATIM_BATCH_NO_MODEL_MEMORY_CHECK"  # set to 1 to skip the comparison with free memory


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
    """A local directory as is, else a hub snapshot (configs, tokenizer, safetensors only); checked either way."""
    path = os.path.expanduser(model)
    if os.path.isdir(path):
        check_model_dir(Path(path), what)
        return Path(path)
    if path.startswith(("/", ".", "~")) or path.count("/") > 1 or os.path.exists(path):
        raise FileNotFoundError(f"{what} directory not found: {model}")
    from huggingface_hub import snapshot_download

    try:
        folder = Path(snapshot_download(repo_id=path, revision=revision, allow_patterns=HUB_PATTERNS))
    except Exception as exc:  # offline, unknown repo, no network: say which model and why
        raise FileNotFoundError(
            f"cannot fetch {what} {model!r} (revision {revision!r}) from the hub or its cache: {exc}"
        ) from exc
    check_model_dir(folder, what)
    return folder


def _bad(what: str, folder: Path, problem: str) -> ValueError:
    return ValueError(f"{what} {folder}: {problem}")


def _read_bounded(path: Path, limit: int, what: str, folder: Path) -> bytes:
    if not path.is_file():
        raise _bad(what, folder, f"{path.name} is not a regular file")
    size = path.stat().st_size
    if size > limit:
        raise _bad(what, folder, f"{path.name} is {size:,} bytes, over the {limit:,} a model file of its kind has")
    with open(path, "rb") as fh:
        return fh.read(limit + 1)[:limit]


def read_config(folder: Path, what: str = "model") -> dict | None:
    """``config.json`` of a model folder (None without one), bounded, parsed, its sizes within ``CONFIG_LIMITS``."""
    path = folder / "config.json"
    if not path.exists():
        return None
    data = _read_bounded(path, MAX_CONFIG_BYTES, what, folder)
    try:
        config = json.loads(data)
    except (ValueError, RecursionError, UnicodeDecodeError):
        raise _bad(what, folder, "config.json is not valid JSON") from None
    if not isinstance(config, dict):
        raise _bad(what, folder, "config.json is not a JSON object")
    for part in (config, *(v for v in config.values() if isinstance(v, dict))):  # text_config, vision_config
        for key, limit in CONFIG_LIMITS.items():
            if (value := part.get(key)) is not None and (type(value) is not int or not 0 < value <= limit):
                raise _bad(what, folder, f"config.json gives {key} = {str(value)[:40]}: not a size this tool "
                                         f"loads (an integer from 1 to {limit:,})")
    return config


def config_parameters(config: dict) -> int:
    """About how many parameters a transformer of ``config`` has: a lower bound, enough to tell one cannot fit."""
    def first(*keys: str, default: int = 0) -> int:
        return next((int(config[k]) for k in keys if type(config.get(k)) is int), default)

    h = first("hidden_size", "d_model", "n_embd")
    layers = first("num_hidden_layers", "num_layers", "n_layer")
    inter = first("intermediate_size", "ffn_dim", "n_inner", default=4 * h)
    vocab, positions = first("vocab_size"), first("max_position_embeddings", "n_positions")
    return vocab * h + positions * h + layers * (4 * h * h + 2 * h * inter)


def safetensors_header(path: Path, what: str = "model", folder: Path | None = None) -> tuple[int, dict]:
    """``(bytes of tensor data, header)`` of a safetensors file, checked without reading its data: the header within
    ``MAX_HEADER_BYTES`` and the file, every tensor's offsets inside the data and of the size its shape gives."""
    folder = folder or path.parent
    if not path.is_file():
        raise _bad(what, folder, f"{path.name} is not a regular file")
    size = path.stat().st_size
    with open(path, "rb") as fh:
        head = fh.read(8)
        if len(head) < 8:
            raise _bad(what, folder, f"{path.name} is {size} bytes: not a safetensors file")
        (n,) = struct.unpack("<Q", head)
        if n > MAX_HEADER_BYTES or 8 + n > size:
            raise _bad(what, folder, f"{path.name} claims a {n:,}-byte header in a {size:,}-byte file: not a "
                                     "safetensors file (damaged or forged)")
        raw = fh.read(n)
    try:
        header = json.loads(raw)
    except (ValueError, RecursionError, UnicodeDecodeError):
        raise _bad(what, folder, f"{path.name}: its header is not valid JSON (damaged or forged)") from None
    if not isinstance(header, dict):
        raise _bad(what, folder, f"{path.name}: its header is not a JSON object")
    data = size - 8 - n
    total = 0
    for name, t in header.items():
        if name == "__metadata__":
            continue
        ok = isinstance(t, dict) and isinstance(t.get("shape"), list) and isinstance(t.get("data_offsets"), list)
        shape, offsets = (t.get("shape"), t.get("data_offsets")) if ok else ([], [])
        ok = ok and all(type(d) is int and d >= 0 for d in shape) and len(offsets) == 2 and all(
            type(o) is int for o in offsets) and 0 <= offsets[0] <= offsets[1] <= data
        item = _DTYPE_BYTES.get(t.get("dtype")) if ok else None
        if not ok or (item is not None and math.prod(shape) * item != offsets[1] - offsets[0]):
            raise _bad(what, folder, f"{path.name}: tensor {str(name)[:80]!r} has a shape, dtype or offsets that "
                                     f"do not fit the file's {data:,} bytes of data (damaged or forged)")
        total += offsets[1] - offsets[0]
    return total, header


def memory_budget() -> int | None:
    """Bytes a model may take here: the memory available now (None when the check is switched off)."""
    if os.environ.get(NO_MEMORY_CHECK, "") not in ("", "0"):
        return None
    import psutil

    return int(psutil.virtual_memory().available)


def check_memory(config: dict | None, dtype_bytes: int, what: str, folder: Path) -> None:
    """Refuse a model whose config describes more parameters than fit the memory at hand."""
    budget = memory_budget()
    if config is None or budget is None:
        return
    need = config_parameters(config) * dtype_bytes
    if need > budget:
        raise _bad(what, folder, f"its config describes about {need / 2**30:,.1f} GiB of parameters, and "
                                 f"{budget / 2**30:,.1f} GiB of memory are available here (set {NO_MEMORY_CHECK}=1 "
                                 "to load it anyway)")


def check_tokenizer(folder: Path, what: str = "model", vocab_size: int | None = None):
    """The folder's tokenizer (None without tokenizer files), its files bounded and parsed; refused when its ids
    run past the model's vocabulary (they would index past the embedding table)."""
    names = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt", "added_tokens.json")
    present = [folder / n for n in names if (folder / n).exists()]
    if not present:
        return None
    for path in present:
        data = _read_bounded(path, MAX_TOKENIZER_BYTES, what, folder)
        if path.suffix == ".json":
            try:
                json.loads(data)
            except (ValueError, RecursionError, UnicodeDecodeError):
                raise _bad(what, folder, f"{path.name} is not valid JSON (truncated or damaged)") from None
    try:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(str(folder))
        n = len(tok)
    except Exception as exc:  # noqa: BLE001 - any failure to build the tokenizer is the folder's
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        raise _bad(what, folder, f"its tokenizer cannot be loaded ({type(exc).__name__}: {first})") from None
    if vocab_size is not None and n > vocab_size:
        raise _bad(what, folder, f"its tokenizer has {n:,} tokens and config.json a vocabulary of {vocab_size:,}: "
                                 "token ids would run past the embedding table")
    return tok


def load_tokenizer(name: str, what: str = "tokenizer"):
    """``AutoTokenizer`` of a hub id or a checked local folder; any failure is one ``ValueError`` line."""
    path = Path(os.path.expanduser(name))
    if path.is_dir():
        tok = check_tokenizer(path, what)
        if tok is None:
            raise _bad(what, path, "no tokenizer files (tokenizer.json, tokenizer_config.json, vocab.txt)")
        return tok
    try:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(name)
    except Exception as exc:  # noqa: BLE001 - unknown id, offline, a damaged cached file: one line
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        raise ValueError(f"{what} {name!r} cannot be loaded ({type(exc).__name__}: {first})") from None


def _stamp(folder: Path) -> tuple:
    try:
        return tuple(sorted((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in folder.iterdir()
                            if p.is_file()))
    except OSError:
        return ()


def check_model_dir(folder: Path, what: str = "model", dtype_bytes: int = 2) -> None:
    """Check a model folder before anything is loaded (the module's docstring); one ``ValueError`` line.
    ``dtype_bytes``: bytes per parameter the memory check assumes. An unchanged folder is checked once."""
    _check_cached(str(folder), what, dtype_bytes, _stamp(Path(folder)))


@lru_cache(maxsize=16)
def _check_cached(folder_s: str, what: str, dtype_bytes: int, stamp: tuple) -> None:
    folder = Path(folder_s)
    config = read_config(folder, what)
    weights = 0
    for path in sorted(folder.glob("*.safetensors")):
        weights += safetensors_header(path, what, folder)[0]
    if config is not None and weights:
        described = config_parameters(config) * min(dtype_bytes, 2)
        if described > 8 * weights + (256 << 20):  # weights are stored at 2 or 4 bytes a parameter
            raise _bad(what, folder, f"its config describes about {described / 2**30:,.1f} GiB of parameters and "
                                     f"its weights hold {weights / 2**30:,.2f} GiB: config.json does not describe "
                                     "these weights (edited or forged)")
    check_memory(config, dtype_bytes, what, folder)
    if config is not None or any(folder.glob("tokenizer*")):
        vocab = config.get("vocab_size") if config else None
        check_tokenizer(folder, what, vocab if type(vocab) is int else None)


def safetensors_files(weights_dir: Path) -> list[Path]:
    """The safetensors files of a model directory, each header checked; a clear error when there are only pickles."""
    files = sorted(Path(weights_dir).glob("*.safetensors"))
    for f in files:
        safetensors_header(f, "model", Path(weights_dir))
    if not files:
        others = sorted(p.name for p in Path(weights_dir).iterdir() if p.suffix in (".bin", ".pt", ".pth", ".ckpt"))
        hint = f" (found {', '.join(others)}; pickle checkpoints are never loaded)" if others else ""
        raise FileNotFoundError(
            f"no safetensors weights (*.safetensors) in {weights_dir}{hint}: convert the model to safetensors first"
        )
    return files


def fingerprint(files: list[Path]) -> str:
    """sha256 over safetensors files: whole up to 1 GiB, else their headers, sizes and 64 sampled blocks."""
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
    """``model_cls.from_pretrained`` (the folder checked first) with the best attention available; returns
    ``(model, attn)``. ``auto`` tries flash-attention 2 (CUDA, half precision, installed), SDPA, then the default."""
    import torch

    check_model_dir(Path(weights_dir), "model", torch.empty((), dtype=torch_dtype).element_size())
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
