"""The rank-budget probe of a Hugging Face model on a text (budgets/hf/probe.py measures).

    name, entry = probe_hf("models/tiny-llama", "corpus.txt", seq_len=128, probe_size=4)
    report = budgets.hf.probe.build_hf_report(name, entry, zoo_blocks=zoo_blocks())

The model comes from train/hf/model_dir.py and is moved to the device; budgets measures
there. The probe batch is cut from the start of a text file, tokenized by the model's own
tokenizer when one was saved. The report names, beside each kind of layer, the zoo block
that declares the same caps: the blocks say which kinds they mirror (zoo/facts.py), and
budgets, which does not know zoo, is handed the mapping.

Errors name the parameters (text=..., seq_len=...); the CLI shows them as its flags.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

import budgets
import zoo
from budgets.hf.geometry import Geometry
from budgets.hf.probe import ProbeProgress, probe_hf_model
from budgets.probe.blocks import MATFREE_FROM
from budgets.probe.selector import short_probe_note
from budgets.rank.eigen import eigensolver_text, measuring

from .model_dir import (
    adapter_dir,
    device_of,
    dtype_of,
    gguf_quantization,
    import_transformers,
    is_gguf,
    load_adapter,
    load_model,
    quiet,
)

# ---------------------------------------------------------------- the probe batch

def read_text(text) -> bytes:
    path = Path(text)
    if not path.exists():
        raise FileNotFoundError(f"text={path}: file not found")
    if not path.is_file():
        raise ValueError(f"text={path}: not a file")
    data = path.read_bytes()
    if not data.strip():
        raise ValueError(f"text={path}: the file is empty")
    return data


def token_ids(data: bytes, tokenizer, vocab_size: int, where: str = "",
              notes: list[str] | None = None) -> torch.Tensor:
    """Token ids [N] of the text: the model's tokenizer, else bytes modulo the vocab size
    (said so in `notes`)."""
    if tokenizer is None:
        if notes is not None:
            notes.append(f"{where}: no tokenizer saved with the model; using raw bytes modulo "
                         f"the vocab size ({vocab_size}) as token ids")
        return torch.tensor(list(data), dtype=torch.long) % vocab_size  # [N]
    text = data.decode("utf-8", errors="replace")
    ids = torch.tensor(tokenizer(text, add_special_tokens=False)["input_ids"], dtype=torch.long)
    if ids.numel() and int(ids.max()) >= vocab_size:
        raise ValueError(f"{where}: the tokenizer gives id {int(ids.max())}, outside the "
                         f"model's vocab of {vocab_size}")
    return ids  # [N]


def bos_of(tokenizer) -> int | None:
    """The BOS id the tokenizer puts first when it adds special tokens, else None."""
    bos = getattr(tokenizer, "bos_token_id", None)
    if bos is None:
        return None
    ids = tokenizer("a", add_special_tokens=True)["input_ids"]
    return int(bos) if ids and ids[0] == bos else None


def bos_text(tokenizer, bos: bool) -> str:
    """How the sequences start, for the report: 'BOS (id 1) first', ..."""
    found = bos_of(tokenizer) if tokenizer is not None else None
    if found is None:
        return "no BOS (the tokenizer adds none)" if tokenizer is not None else "no BOS"
    return f"BOS (id {found}) first, as the tokenizer adds it" if bos else \
        f"no BOS (--no-bos; the tokenizer adds id {found})"


def with_bos(rows: torch.Tensor, bos: int | None) -> torch.Tensor:
    """rows [N, T - 1] behind a BOS column -> [N, T]; rows unchanged without a BOS."""
    if bos is None:
        return rows
    return torch.cat([torch.full((len(rows), 1), bos, dtype=rows.dtype), rows], dim=1)


def probe_batch(ids: torch.Tensor, seq_len: int, probe_size: int, where: str = "",
                bos: int | None = None) -> torch.Tensor:
    """The first probe_size * seq_len tokens as [B, T] (contiguous, non-overlapping), each
    row after a BOS when `bos` is an id (then T - 1 text tokens a row)."""
    body = seq_len - (bos is not None)
    if body < 1:
        raise ValueError(f"seq_len={seq_len}: a sequence after the BOS needs a token")
    need = probe_size * body
    if ids.numel() < need:
        raise ValueError(f"text={where}: too short for the probe batch: {ids.numel()} "
                         f"tokens, but probe_size={probe_size} x seq_len={seq_len} "
                         f"needs {need}")
    return with_bos(ids[:need].view(probe_size, body), bos)  # [B, T]


# ---------------------------------------------------------------- the probe

def load_for_probe(model_dir, text, adapter=None, device: str = "cpu", dtype: str = "float32"
                   ) -> tuple[nn.Module, object | None, bytes]:
    """(model on `device` in `dtype`, tokenizer or None, the text's bytes), the cheap checks
    first: a bad text, adapter directory, device or dtype costs no model load."""
    data = read_text(text)
    if adapter is not None:
        adapter_dir(adapter)
    where, _ = device_of(device), dtype_of(dtype)
    model, tokenizer = load_model(model_dir, dtype)
    if adapter is not None:
        model = load_adapter(model, adapter, dtype)
    return model.to(where), tokenizer, data


def probe_hf(model_dir, text, seq_len: int = 128, probe_size: int = 4, eps: float = 0.1,
             with_spectra: bool = False, adapter=None, notes: list[str] | None = None, *,
             device: str = "cpu", dtype: str = "float32", layers: list[int] | None = None,
             matfree_from: int | None = MATFREE_FROM, k_max: int = 256,
             progress: Callable[[ProbeProgress], None] | None = None,
             bos: bool = True) -> tuple[str, dict]:
    """(variant name, build_report entry) of the model saved in `model_dir` (with the PEFT
    adapter saved in `adapter` applied, if given), probed on the start of the file `text`,
    on `device` ("cpu", "cuda", "auto") with the forward pass in `dtype` (a DTYPES name).
    `layers`, `matfree_from`, `k_max` and `progress` are budgets.hf.probe.probe_hf_model's.
    Each sequence starts with the tokenizer's BOS where it adds one, unless not `bos`.
    Lines for the user (e.g. no tokenizer saved) are appended to `notes`."""
    model_dir = Path(model_dir)
    model, tokenizer, data = load_for_probe(model_dir, text, adapter, device, dtype)
    g = Geometry.from_config(model.config)
    g.check_seq_len(seq_len)
    ids = token_ids(data, tokenizer, int(model.config.vocab_size), str(text), notes)
    first = bos_of(tokenizer) if bos and tokenizer is not None else None
    batch = probe_batch(ids, seq_len, probe_size, str(text), first)  # [B, T]
    where = next(model.parameters()).device
    # on busy cores torch's own OpenMP team collapses as LAPACK's did: one thread there
    with quiet(import_transformers()), measuring(where) as threads:
        probe_of = probe_zoo_model if budgets.probeable_blocks(model) else probe_hf_model
        runs_on_its_own(model, batch.to(where), g.model_type)
        probe, loss = probe_of(model, batch.to(where), eps, with_spectra,
                               layers=layers, matfree_from=matfree_from, k_max=k_max,
                               progress=progress)
    source = {"hf": str(model_dir), "model_type": g.model_type, "text": str(text),
              "tokens": "tokenizer" if tokenizer is not None else "bytes % vocab_size",
              "probe_size": probe_size, "seq_len": seq_len, "device": str(where),
              **({"threads": threads} if where.type == "cpu" else {}),
              "eigensolver": eigensolver_text(where), "dtype": dtype,
              "n_layers": g.n_layers, "bos": bos_text(tokenizer, bos),
              **({"layers": measured_layers(probe)} if layers else {}),
              **({"adapter": str(Path(adapter))} if adapter is not None else {}),
              # a GGUF file: its tensors' storage types (the probe reads them dequantized)
              **({"gguf": {"file": model_dir.name, "quantization": gguf_quantization(model_dir)}}
                 if is_gguf(model_dir) else {})}
    if notes is not None:
        notes.extend(probe_notes(probe, dtype, g.n_layers))
    entry = {"probe": probe, "step": 0, "params": sum(p.numel() for p in model.parameters()),
             "metrics": {"probe/loss": loss}, "source": source}
    return model_dir.resolve().name or g.model_type, entry


def runs_on_its_own(model, ids: torch.Tensor, model_type: str) -> None:
    """A ValueError in one line where the model's own forward fails on the first tokens
    of the probe batch, before any capture is in the way (a saved config whose sizes do not
    fit together: longcat_flash's head_dim, the rotary width, unlike its qk_rope_head_dim),
    rather than that failure's traceback from inside the probe."""
    try:
        with torch.no_grad():
            model(input_ids=ids[:, :8], use_cache=False)
    except Exception as e:  # noqa: BLE001 - whatever the model's own code raises
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise ValueError(f"{model_type}: the model's own forward fails on the probe's first "
                         f"tokens, with no capture in the way ({type(e).__name__}: {first}); "
                         f"its saved config does not run") from None


def probe_zoo_model(model, ids: torch.Tensor, eps: float = 0.1, with_spectra: bool = False,
                    *, layers: list[int] | None = None, matfree_from: int | None = MATFREE_FROM,
                    k_max: int = 256, progress: Callable[[ProbeProgress], None] | None = None
                    ) -> tuple[dict, float]:
    """probe_hf_model's answer for a model whose mixers are zoo blocks (a variant that
    `rankzoo export` wrote): the blocks' own probe methods, as `rankzoo train` measures a
    run, so every layer is read (recurrent ones too) with the run's own figures."""
    if layers is not None:
        raise ValueError(f"--layers {','.join(map(str, layers))}: a rankzoo model is "
                         "measured whole, every layer through its block's probe methods")
    probe = budgets.probe_model(model, ids, eps, with_spectra, matfree_from=matfree_from,
                                k_max=k_max, progress=progress)
    with torch.no_grad():
        logits = model(ids).logits.float()  # [B, T, vocab]
    loss = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten())
    return probe, float(loss)


def measured_layers(probe: dict) -> list[int]:
    """The decoder layers (the model's numbers) with a measured mixer, each once: a layer
    of two mixers (falcon_h1's attention and SSM) is one layer."""
    return sorted({ly["layer"] for ly in probe["layers"]})


def probe_notes(probe: dict, dtype: str, n_layers: int) -> list[str]:
    """What the user should know about how the probe measured: a subset of layers, a
    half-precision forward pass, the matrix-free mode, a top-k selection that cannot bite."""
    notes, measured = [], measured_layers(probe)
    if len(measured) < n_layers:
        notes.append(f"measured {len(measured)} of the model's {n_layers} layers: "
                     f"{', '.join(map(str, measured))}")
    if dtype != "float32":
        notes.append(f"forward pass in {dtype}: singular values below ~1e-2 s_1 are noise "
                     f"at that precision (docs/METRICS.md); metrics are computed in fp32")
    if "matfree" in probe:
        m = probe["matfree"]
        notes.append(f"attention measured matrix-free (probe length {probe['seq_len']} >= "
                     f"{m['from']}): rank_eps decided up to {m['k_max']} values, erank only "
                     f"where those hold the whole spectrum")
    short = short_probe_note(probe)  # DSA probed at T <= index_topk
    if short is not None:
        notes.append(short)
    return notes


def zoo_blocks() -> dict[str, str]:
    """HF layer kind (global, sliding, ssm) -> the zoo block that declares the same caps:
    each registered block's `facts.mirrors` (the registry keeps a kind to one block)."""
    return {kind: name for name in zoo.families() for kind in zoo.facts_of(name).mirrors}
