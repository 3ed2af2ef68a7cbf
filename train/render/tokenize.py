"""`rankzoo tokenize`'s document drawn: the shards written, one row each, and the data
section that trains on them.

    for part in tokenize_tables(tokenize_document(...)): out.print(part)
"""

from __future__ import annotations

from typing import Any

from rich.table import Table
from rich.text import Text

from .table import TableSpec, columns, to_rich


def tokenize_tables(doc: dict[str, Any]) -> list[Table | Text]:
    rows = [(s["path"], s["split"], f"{s['tokens']:,}") for s in doc["shards"]]
    trained = f"; the BPE trained on them: {doc['tokenizer_file']}" if doc["tokenizer_file"] else ""
    spec = TableSpec(
        columns=columns("shard", "split", "tokens", numeric=("tokens",)), rows=rows,
        title=f"{doc['tokens']:,} tokens of {doc['tokenizer']} ({doc['vocab_size']:,} ids)",
        legend=f"from {doc['files']:,} files ({doc['bytes']:,} bytes); format "
               f"{doc['format']}; validation: the last {doc['val_fraction']:g} of the "
               f"tokens{trained}")
    data = ", ".join(f"{k}: {v}".replace("'", "") for k, v in doc["data"].items())
    return [to_rich(spec), Text(f"to train on them: data: {{{data}}}")]
