"""The stock transformers Trainer with a tiny GPT-2 built from a config (no downloads), under
stoker.enable(); trains 3 steps with a checkpoint, then resumes from it to step 6. A callback
reports, at every step, who served the Trainer's loader, and the model records for every sample
whether a stoker worker loaded it (on resume the Trainer iterates a skipping wrapper, not the
loader the callback sees). argv: OUTDIR REPORT."""

import json
import os
import sys

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

import stoker

OUT, REPORT = sys.argv[1:3]
BAD = 5


class Tokens(torch.utils.data.Dataset):
    def __len__(self):
        return 24

    def __getitem__(self, i):
        if i == BAD:
            raise ValueError(f"sample {i} is corrupt")
        ids = torch.arange(8) % 16
        return {"input_ids": ids, "labels": ids,
                "worker": torch.tensor(int(stoker.get_worker_info() is not None))}


class Model(GPT2LMHeadModel):
    def forward(self, worker=None, **kw):
        self.engine_flags = getattr(self, "engine_flags", []) + worker.tolist()
        return super().forward(**kw)


class Served(TrainerCallback):
    def __init__(self):
        self.steps = []

    def on_step_end(self, args, state, control, train_dataloader=None, **kw):
        base = getattr(train_dataloader, "base_dataloader", train_dataloader)
        st = stoker.stats(base)
        self.steps.append([state.global_step, st["served_by"], st["batches_yielded"]])


def run(max_steps, resume):
    cfg = GPT2Config(n_layer=1, n_head=1, n_embd=8, vocab_size=16, n_positions=8)
    model = Model(cfg)
    args = TrainingArguments(output_dir=OUT, max_steps=max_steps, per_device_train_batch_size=2,
                             dataloader_num_workers=2, save_steps=3, report_to=[], use_cpu=True,
                             logging_strategy="no", remove_unused_columns=False,
                             disable_tqdm=True, save_only_model=False)
    cb = Served()
    trainer = Trainer(model=model, args=args, train_dataset=Tokens(), callbacks=[cb])
    trainer.train(resume_from_checkpoint=resume)
    return cb.steps, model.engine_flags


if __name__ == "__main__":
    stoker.enable(on_error="skip")
    first, flags1 = run(3, None)
    second, flags2 = run(6, os.path.join(OUT, "checkpoint-3"))
    with open(REPORT, "w") as f:
        json.dump({"first": first, "resumed": second, "engine_first": flags1,
                   "engine_resumed": flags2}, f)
