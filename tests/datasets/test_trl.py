"""One SFT and one DPO step of TRL on the Hugging Face exports, on the CPU.

The model is a tiny randomly initialised Llama and the tokenizer a word-level one trained
here on the export's own text, so that nothing is downloaded. Needs the `trl` extra (TRL
and a CPU build of torch, found for Python 3.11 only); skipped without it. Marked slow.

It runs on a SQLite store only: what it tests is TRL reading the files, and the exports
themselves are tested on both databases in test_exports.py (a PostgreSQL case skipped
where torch is missing would fail .ci/run, which refuses any skipped PostgreSQL test).
"""

from __future__ import annotations

import asyncio
import copy
import sys
from pathlib import Path

import pytest
from recorded_run import RUN, record_run

import artstore
from artstore.datasets import Selection, create_dataset
from artstore.datasets.export import export_dataset

pytestmark = pytest.mark.slow

NO_TRL = "TRL and torch are not installed (pip install -e '.[trl]', Python 3.11)"
TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }} : {{ m['content'] }} <eos> {% endfor %}"
    "{% if add_generation_prompt %}assistant : {% endif %}"
)


def exported(tmp_path: Path) -> tuple[Path, Path]:
    async def export() -> None:
        async with await artstore.open_store(f"sqlite:///{tmp_path / 'a.db'}") as store:
            await record_run(store)
            dataset = await create_dataset(store, "all", Selection(run=RUN))
            await export_dataset(store, dataset, "hf-sft", tmp_path / "sft")
            await export_dataset(store, dataset, "hf-dpo", tmp_path / "dpo")

    asyncio.run(export())
    return tmp_path / "sft", tmp_path / "dpo"


def tiny_model_and_tokenizer(texts: list[str]):
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    words = Tokenizer(models.WordLevel(unk_token="<unk>"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    special = ["<unk>", "<pad>", "<eos>"]
    words.train_from_iterator(texts, trainers.WordLevelTrainer(special_tokens=special))
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=words, unk_token="<unk>", pad_token="<pad>", eos_token="<eos>"
    )
    tokenizer.chat_template = TEMPLATE
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=256,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    return LlamaForCausalLM(config), tokenizer


def without_arts_mask_patch(monkeypatch: pytest.MonkeyPatch) -> None:
    """`import art` patches transformers' mask arguments for its own trainer whenever
    transformers is installed; the patch calls the original with an argument newer
    transformers no longer take. TRL here runs with transformers as it is."""
    import art  # noqa: F401  (patches now, if it does, not in the middle of the test)
    from transformers import masking_utils

    patches = sys.modules.get("art.transformers.patches")
    original = getattr(patches, "_preprocess_mask_arguments", None)
    if original is not None:
        monkeypatch.setattr(masking_utils, "_preprocess_mask_arguments", original)


def test_trl_takes_an_sft_and_a_dpo_step_on_the_exports(tmp_path, monkeypatch):
    pytest.importorskip("torch", reason=NO_TRL)
    pytest.importorskip("trl", reason=NO_TRL)
    without_arts_mask_patch(monkeypatch)
    import datasets
    import torch
    from trl import DPOConfig, DPOTrainer, SFTConfig, SFTTrainer

    sft_path, dpo_path = exported(tmp_path)
    cache = str(tmp_path / "cache")
    sft = datasets.load_dataset(str(sft_path), split="train", cache_dir=cache)
    dpo = datasets.load_dataset(str(dpo_path), split="train", cache_dir=cache)
    texts = [m["content"] for row in sft for m in row["messages"]] + ["system user assistant tool"]
    model, tokenizer = tiny_model_and_tokenizer(texts)
    before = [p.detach().clone() for p in model.parameters()]
    common = {
        "max_steps": 1,
        "per_device_train_batch_size": 1,
        "report_to": [],
        "use_cpu": True,
        "save_strategy": "no",
        "dataloader_num_workers": 0,
    }
    trained = SFTTrainer(
        model=model,
        args=SFTConfig(output_dir=str(tmp_path / "sft-out"), **common),
        train_dataset=sft,
        processing_class=tokenizer,
    ).train()
    assert trained.global_step == 1 and torch.isfinite(torch.tensor(trained.training_loss))
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    trained = DPOTrainer(
        model=model,
        ref_model=copy.deepcopy(model),
        args=DPOConfig(output_dir=str(tmp_path / "dpo-out"), **common),
        train_dataset=dpo,
        processing_class=tokenizer,
    ).train()
    assert trained.global_step == 1 and torch.isfinite(torch.tensor(trained.training_loss))
