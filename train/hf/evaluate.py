"""lm-evaluation-harness on an exported model (`rankzoo eval`), offline.

    scores = evaluate_model("models/quick-mha", ["my_task"], include_path="tasks/")

Tasks are read from the YAML files under `include_path` only (lm-eval's own task list is
left out, so nothing is looked up or downloaded): a task names its data as a local file
(`dataset_path: json`, `dataset_kwargs: {data_files: ...}`). The model loads through
lm-eval's "hf" model, that is AutoModelForCausalLM, which knows model_type "rankzoo" once
`zoo` is imported. lm-eval is an optional extra: `pip install 'rankzoo[eval]'`.

The scores come back as {task: {metric: value}} (lm-eval's ",none" filter suffix taken
off, standard errors left out); given a variant directory, `rankzoo eval` keeps them as its
eval.json, which `rankzoo report` shows beside the rank figures.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

INSTALL_HINT = "pip install 'rankzoo[eval]'"
OFFLINE = {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def import_lm_eval():
    """lm_eval, or a clear error naming the extra that installs it."""
    try:
        import lm_eval
        import lm_eval.tasks
    except ImportError as e:
        raise ValueError(f"rankzoo eval needs lm-evaluation-harness, which is not installed "
                         f"({e}): {INSTALL_HINT}") from None
    return lm_eval


@contextlib.contextmanager
def offline():
    """Hugging Face's hub and datasets told to read local files only, restored after."""
    saved = {k: os.environ.get(k) for k in OFFLINE}
    os.environ.update(OFFLINE)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def scores_of(results: dict) -> dict[str, dict[str, float]]:
    """{task: {metric: value}} from lm-eval's results: numbers only, no stderr."""
    out = {}
    for task, metrics in results.items():
        out[task] = {key.split(",")[0]: float(value) for key, value in metrics.items()
                     if isinstance(value, (int, float)) and not isinstance(value, bool)
                     and "_stderr" not in key and key != "sample_len"}
    return out


def evaluate_model(model_dir: str | Path, tasks: list[str], include_path: str | Path,
                   batch_size: int = 1, device: str = "cpu", limit: int | None = None,
                   ) -> tuple[dict[str, dict[str, float]], list[str]]:
    """lm-eval's simple_evaluate of an exported model on the tasks under include_path:
    ({task: {metric: value}}, notes)."""
    import zoo  # noqa: F401  (AutoModelForCausalLM learns model_type "rankzoo")

    lm_eval = import_lm_eval()
    include = Path(include_path)
    if not include.exists():
        raise ValueError(f"--include {include}: no such file or directory of task YAMLs")
    if not tasks:
        raise ValueError("--tasks: name at least one task")
    with offline():
        manager = lm_eval.tasks.TaskManager(include_path=str(include), include_defaults=False)
        unknown = [t for t in tasks if t not in manager.all_tasks]
        if unknown:
            raise ValueError(f"--tasks {','.join(unknown)}: not among the tasks under "
                             f"{include} ({', '.join(sorted(manager.all_tasks)) or 'none'})")
        args, notes = model_args(model_dir)
        out = lm_eval.simple_evaluate(
            model="hf", model_args=args,
            tasks=list(tasks), task_manager=manager, batch_size=batch_size, device=device,
            limit=limit, log_samples=False, bootstrap_iters=0)
    return scores_of(out["results"]), notes


def model_args(model_dir: str | Path) -> tuple[dict, list[str]]:
    """lm-eval's "hf" model arguments: the directory in fp32, and a prefix token where the
    tokenizer has neither BOS nor EOS (lm-eval asks for one; a BPE rankzoo trained has no
    special tokens): its pad token, else id 0. The prefix only stands before an empty
    context, which multiple-choice tasks do not have."""
    from transformers import AutoTokenizer

    args: dict = {"pretrained": str(model_dir), "dtype": "float32"}
    try:
        tok = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    except Exception as e:  # transformers raises many types for a directory without one
        raise ValueError(f"{model_dir}: lm-eval reads text through the model's tokenizer, "
                         f"and none loads from it ({str(e).splitlines()[0]}); export a run "
                         f"trained through data.tokenizer") from None
    if tok.bos_token_id is None and tok.eos_token_id is None:
        args["prefix_token_id"] = tok.pad_token_id or 0
        return args, [f"the tokenizer has no BOS or EOS token: id {args['prefix_token_id']} "
                      "prefixes an empty context"]
    return args, []
