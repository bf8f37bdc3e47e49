"""Versioned datasets of rollouts, and exports of them in the formats trainers load.

`selection.py`: choosing rollouts, freezing the choice as a `dataset.created` event, and
reading versions back (list, show, diff); `export.py`: OpenAI chat fine-tuning JSONL,
Hugging Face parquet in TRL's conversational formats (SFT, DPO, KTO), and ART parquet.
"""

from artstore.datasets.selection import (
    Dataset,
    Selection,
    create_dataset,
    dataset_diff,
    list_datasets,
    read_dataset,
)

__all__ = [
    "Dataset",
    "Selection",
    "create_dataset",
    "dataset_diff",
    "list_datasets",
    "read_dataset",
]
