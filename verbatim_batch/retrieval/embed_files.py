"""What a sentence-transformers model folder says (``modules.json``, ``1_Pooling``, ``sentence_bert_config.json``,
``config_sentence_transformers.json``): transformer sub-folder, pooling, max length and prompts, each file read
bounded and checked (a damaged or forged one is one line)."""

from __future__ import annotations

import json
from pathlib import Path

POOLING_MODES = ("mean", "cls", "lasttoken")


def _read_json(path: Path) -> dict | list | None:
    """A small JSON file of a model folder, None when absent; bounded and parsed with errors caught (one line)."""
    from verbatim_batch.core.models import MAX_CONFIG_BYTES

    try:
        if path.stat().st_size > MAX_CONFIG_BYTES or not path.is_file():
            raise ValueError
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise ValueError(f"{path}: not a JSON file of a model folder (damaged, forged, or over "
                         f"{MAX_CONFIG_BYTES >> 20} MB)") from None


def _subfolder(model_dir: Path, sub) -> str:
    """A module path of modules.json: a folder inside the model folder, never outside it."""
    if not isinstance(sub, str) or sub.startswith(("/", "\\")) or ".." in Path(sub).parts:
        raise ValueError(f"{model_dir}/modules.json names {str(sub)[:80]!r}: not a folder inside the model folder")
    return sub


def sentence_transformers_config(model_dir: Path) -> dict:
    """What the sentence-transformers files say: transformer subdir, pooling, max length, prompts."""
    out = {"transformer_path": "", "pooling": "mean", "include_prompt": True, "max_seq_length": None,
           "prompts": {}, "query_prompt": None}
    pooling_path = "1_Pooling"
    modules = _read_json(model_dir / "modules.json")
    if isinstance(modules, list):
        for mod in modules:
            mod = mod if isinstance(mod, dict) else {"type": repr(mod)[:80]}
            kind = str(mod.get("type", "")).rsplit(".", 1)[-1]
            if kind == "Transformer":
                out["transformer_path"] = _subfolder(model_dir, mod.get("path", "") or "")
            elif kind == "Pooling":
                pooling_path = _subfolder(model_dir, mod.get("path", pooling_path))
            elif kind != "Normalize":
                raise ValueError(
                    f"{model_dir}: sentence-transformers module {mod.get('type')!r} is not supported "
                    "(only Transformer, Pooling and Normalize)"
                )
    pool = _read_json(model_dir / pooling_path / "config.json")
    if isinstance(pool, dict):
        out["pooling"] = _pooling_mode(pool, model_dir)
        out["include_prompt"] = bool(pool.get("include_prompt", True))
    for sub in (out["transformer_path"], ""):
        sbert = _read_json(model_dir / sub / "sentence_bert_config.json")
        if isinstance(sbert, dict) and sbert.get("max_seq_length"):
            out["max_seq_length"] = int(sbert["max_seq_length"])
            break
    st = _read_json(model_dir / "config_sentence_transformers.json")
    if isinstance(st, dict):
        out["prompts"] = dict(st.get("prompts") or {})
        out["query_prompt"] = st.get("query_prompt")
    return out


def _pooling_mode(pool: dict, model_dir: Path) -> str:
    names = {"pooling_mode_cls_token": "cls", "pooling_mode_mean_tokens": "mean", "pooling_mode_lasttoken": "lasttoken",
             "pooling_mode_max_tokens": "max", "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
             "pooling_mode_weightedmean_tokens": "weightedmean"}
    mode = pool.get("pooling_mode")
    if mode is None:
        modes = [name for key, name in names.items() if pool.get(key)]
    else:
        modes = [mode] if isinstance(mode, str) else list(mode)
    modes = ["mean" if m == "mean_tokens" else "cls" if m == "cls_token" else m for m in modes]
    if len(modes) != 1 or modes[0] not in POOLING_MODES:
        raise ValueError(f"{model_dir}: pooling {modes or 'none'} is not supported (one of {POOLING_MODES})")
    return modes[0]


def resolve_max_length(requested: int | None, st_conf: dict, tokenizer, mconf) -> int:
    pos = getattr(mconf, "max_position_embeddings", None)
    tok_max = getattr(tokenizer, "model_max_length", None)
    tok_max = tok_max if isinstance(tok_max, int) and 0 < tok_max < 1_000_000 else None
    model_limit = min(x for x in (pos, tok_max, 1 << 30) if x)
    if requested is not None:
        if pos and requested > pos:
            raise ValueError(f"max_length {requested} exceeds the model's max_position_embeddings {pos}")
        return int(requested)
    if st_conf["max_seq_length"]:
        return int(min(st_conf["max_seq_length"], pos or st_conf["max_seq_length"]))
    return int(model_limit if model_limit < (1 << 30) else 512)


def resolve_prompt(setting: str | None, prompts: dict, keys: tuple[str, ...], fallback: str | None) -> str | None:
    if setting != "auto":
        return setting or None
    for key in keys:
        if prompts.get(key):
            return prompts[key]
    return fallback or None
