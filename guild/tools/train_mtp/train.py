"""`guild train-mtp`'s run: teacher data, the training loop with its checkpoints, evaluation, the head written."""

from __future__ import annotations

import math
import os
import shutil
import time
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from ...errors import GuildError, UnsupportedArchitectureError
from ...formats.files import atomic_path
from ...formats.gguf import GGUFFile, f32
from ...load import set_threads
from ...models import load_model
from ...models.validate import FEATURE_KEY
from ...text.tokenizer import Tokenizer
from ...upcycle import resolve_model
from .config import (
    CE_CHUNK,
    DEFAULT_BATCH,
    DEFAULT_DEPTH,
    DEFAULT_GEN_TOKENS,
    DEFAULT_LR,
    DEFAULT_SEED,
    DEFAULT_SEQ_LEN,
    DEFAULT_STEPS,
    DEFAULT_TEXT_TOKENS,
    DEPTH_WEIGHT,
    DRAFT_VOCAB,
    MAX_DEPTH,
    SOURCES,
    SUPPORTED_ARCHS,
    TrainConfig,
    TrainMtpError,
    feature_layers,
)
from .data import generate_documents, text_documents
from .model import _lm_head_ce, base_block, build_head
from .teacher import Dataset, _load_npz, _save_npz, teacher_pass
from .write import dequantized, export_tensors, gguf_name, write_head_gguf


def _torch():
    try:
        import torch  # optional: guild[train]
    except ImportError:
        raise GuildError("train-mtp needs torch: pip install 'guild[train]'") from None
    return torch


# =========================================================================================================
# Progress
# =========================================================================================================
class _Bars:
    """rich progress bars on stderr (or nothing): bar(description, total, unit) → advance(n, **fields)."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self._progress = None
        self.console = None
        if enabled:

            self.console = Console(stderr=True, highlight=False)

    def log(self, msg: str) -> None:
        if self.console is not None:
            self.console.print(msg, style="dim", markup=False)

    def bar(self, description: str, total: int, unit: str):
        if not self.enabled:
            return lambda n=1, **kw: None

        if self._progress is None:
            self._progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                      TextColumn("{task.fields[unit]} {task.fields[info]}"), TimeElapsedColumn(),
                                      TextColumn("eta"), TimeRemainingColumn(), console=self.console)
            self._progress.start()
        task = self._progress.add_task(description, total=total, info="", unit=unit)
        prog = self._progress

        def advance(n: int = 1, **fields) -> None:
            info = " · ".join(f"{k} {v}" for k, v in fields.items())
            prog.update(task, advance=n, **({"info": info} if fields else {}))

        return advance

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None


# =========================================================================================================
# Training
# =========================================================================================================
def _lr_at(step: int, steps: int, lr: float) -> float:
    warm = min(50, max(1, steps // 10))
    if step < warm:
        return lr * (step + 1) / warm
    t = (step - warm) / max(1, steps - warm)
    return lr * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * t)))


def _batch_chunks(train: np.ndarray, batch: int, seed: int, step: int) -> np.ndarray:
    """The chunks of a step: a function of (seed, step) only, so a resumed run draws the same batches."""
    rng = np.random.default_rng([seed, 4, step])
    return train[np.sort(rng.choice(train.size, size=min(batch, train.size), replace=False))]


def evaluate(torch, head, emb, lm_head, ds: Dataset, chunks: np.ndarray, draft_vocab: np.ndarray | None = None,
             batch: int = 8, depth: int = 2) -> dict:
    """Held-out top-1 acceptance (head argmax == base greedy target), mean loss, and with a draft vocabulary its
    coverage of the targets and the acceptance of an argmax restricted to it. With depth >= 2, `acceptance_d{d}`:
    the acceptance of the d-th chained draft where the chain's earlier drafts were right and the text went
    their way (what a window that got that far sees)."""
    n = correct = correct_dv = covered = 0
    deep = np.zeros((2, depth + 1), np.int64)  # [right, asked] per depth
    loss = 0.0
    dv = None if draft_vocab is None else torch.from_numpy(np.asarray(draft_vocab, np.int64))
    in_dv = None
    if dv is not None:
        in_dv = torch.zeros(lm_head.shape[0], dtype=torch.bool)
        in_dv[dv] = True
    with torch.no_grad():
        for i in range(0, chunks.size, batch):
            hn, ft, nxt, tgt, valid = (torch.from_numpy(a) for a in ds.batch(chunks[i : i + batch]))
            outs = head(hn, emb[nxt], ft, depth)
            y, t = outs[0][valid], tgt[valid]
            for s in range(0, y.shape[0], CE_CHUNK):
                lg = y[s : s + CE_CHUNK] @ lm_head.T
                tt = t[s : s + CE_CHUNK]
                loss += float((torch.logsumexp(lg, -1) - lg.gather(1, tt[:, None])[:, 0]).sum())
                correct += int((lg.argmax(-1) == tt).sum())
                if dv is not None:
                    correct_dv += int((dv[lg[:, dv].argmax(-1)] == tt).sum())
                    covered += int(in_dv[tt].sum())
                n += tt.numel()
            ok = valid
            followed = torch.zeros_like(valid)
            followed[:, 1:] = nxt[:, 1:] == tgt[:, :-1]  # the token after row p-1's target is the greedy one
            for d, o in enumerate(outs, 1):
                right = ((o @ lm_head.T).argmax(-1) == tgt) & valid
                if d == 1:
                    ok = right
                    continue
                asked = torch.zeros_like(valid)
                asked[:, 1:] = ok[:, :-1] & followed[:, 1:]  # the chain reached depth d at row p
                ok = right & asked
                deep[:, d] += (int(ok.sum()), int(asked.sum()))
    out = {"rows": n, "acceptance": correct / n if n else float("nan"), "loss": loss / n if n else float("nan")}
    for d in range(2, depth + 1):
        out[f"acceptance_d{d}"] = deep[0, d] / deep[1, d] if deep[1, d] else float("nan")
    if dv is not None:
        out.update(draft_vocab_acceptance=correct_dv / n if n else float("nan"),
                   draft_vocab_coverage=covered / n if n else float("nan"))
    return out


def _pool(evals: list[dict]) -> dict:
    """evaluate() results over disjoint row sets → the figures over their union (row-weighted)."""
    n = sum(e["rows"] for e in evals)
    out = {"rows": n}
    for k in evals[0]:
        if k != "rows":
            out[k] = sum(e[k] * e["rows"] for e in evals if e["rows"]) / n if n else float("nan")
    return out


def _atomic_torch_save(torch, obj, path: Path) -> None:
    with atomic_path(path, "the checkpoint") as tmp:
        torch.save(obj, tmp)


def train_mtp(
    model_path: str | os.PathLike | None,
    out_path: str | os.PathLike,
    *,
    steps: int = DEFAULT_STEPS,
    text_tokens: int = DEFAULT_TEXT_TOKENS,
    gen_tokens: int = DEFAULT_GEN_TOKENS,
    seq_len: int = DEFAULT_SEQ_LEN,
    batch: int = DEFAULT_BATCH,
    lr: float = DEFAULT_LR,
    seed: int = DEFAULT_SEED,
    depth: int = DEFAULT_DEPTH,
    fuse: bool = True,
    threads: int | None = None,
    resume: bool = True,
    progress: bool = True,
    ckpt_every: int = 50,
    stop_after: int | None = None,
) -> dict:
    """Train an MTP head for the base `model_path` (a GGUF path or tag), write it to `out_path` (GGUF) and return
    a summary (held-out acceptance, rows, phase times...). Checkpoints go to `<out_path>.ckpt/`; with `resume`
    a run of the same configuration continues from there (teacher data and training state). `stop_after`
    (tests) stops after that many steps of this call, checkpointed, without writing the head. `depth`: the draft
    depths trained (training-time test); `fuse`: the head fuses a low, a middle and a high layer's rows with
    the final hidden (EAGLE-3), else it reads the final hidden only."""

    t_start = time.perf_counter()
    for flag, v, lo in (("--steps", steps, 1), ("--text-tokens", text_tokens, 0), ("--gen-tokens", gen_tokens, 0),
                        ("--seq-len", seq_len, 16), ("--batch", batch, 1), ("--seed", seed, 0), ("--depth", depth, 1)):
        if int(v) != v or v < lo:
            raise TrainMtpError(f"{flag} must be an integer >= {lo}, got {v}")
    if depth > MAX_DEPTH:
        raise TrainMtpError(f"--depth must be at most {MAX_DEPTH}, got {depth}")
    if text_tokens + gen_tokens < 64:
        raise TrainMtpError("--text-tokens + --gen-tokens must be at least 64")
    if not (lr > 0 and math.isfinite(lr)):
        raise TrainMtpError(f"--lr must be a positive number, got {lr}")
    if ckpt_every < 1:
        raise TrainMtpError(f"ckpt_every must be >= 1, got {ckpt_every}")
    out_path = Path(out_path)
    if out_path.is_dir():
        raise TrainMtpError(f"-o {out_path}: is a directory")
    if not out_path.parent.is_dir():
        raise TrainMtpError(f"-o {out_path}: the directory {out_path.parent} does not exist")
    torch = _torch()
    n_threads = set_threads(threads)
    torch.set_num_threads(n_threads)

    bars = _Bars(progress)
    phases: dict[str, float] = {}
    try:
        t0 = time.perf_counter()
        path = resolve_model(model_path, progress=progress)
        if out_path.exists() and out_path.resolve() == Path(path).resolve():
            raise TrainMtpError(f"-o {out_path}: would overwrite the base model")
        g = GGUFFile(path)
        if g.architecture not in SUPPORTED_ARCHS:
            raise UnsupportedArchitectureError(
                f"{g.path}: train-mtp supports architectures {', '.join(SUPPORTED_ARCHS)}, not '{g.architecture}'")
        model = load_model(g)
        args = model.args
        if seq_len > args.context_length:
            raise TrainMtpError(f"--seq-len {seq_len} exceeds the model's context length {args.context_length}")
        tok = Tokenizer.from_metadata(g.metadata)
        layers = feature_layers(args.n_layers) if fuse else ()
        cfg = TrainConfig(g.identity_digest(), layers, int(depth), int(text_tokens), int(gen_tokens), int(seq_len),
                          int(seed), int(steps), int(batch), float(lr))
        ckpt = Path(f"{out_path}.ckpt")
        if not resume and ckpt.exists():
            shutil.rmtree(ckpt)
        (ckpt / "data").mkdir(parents=True, exist_ok=True)
        phases["load"] = time.perf_counter() - t0

        # -- teacher data ------------------------------------------------------------------------------
        parts = []
        for name, budget in (("text", text_tokens), ("gen", gen_tokens)):
            t0 = time.perf_counter()
            f = ckpt / "data" / f"{name}.npz"
            part = _load_npz(f, cfg.data_key(name)) if resume else None
            if part is not None:
                bars.log(f"{name} teacher data: reusing {f} ({part['lens'].size} chunks, {part['tokens'].size} rows)")
            else:
                if name == "text":
                    docs = text_documents(tok, budget, seed, seq_len) if budget else []
                else:
                    docs = []
                    if budget:
                        adv = bars.bar("generating (base, greedy)", budget, "tokens")
                        docs = generate_documents(model, tok, budget, seed, min(args.context_length, 4 * seq_len),
                                                  adv)
                n_rows = sum(len(ids) for _, ids in docs)
                adv = bars.bar(f"teacher pass ({name})", n_rows, "rows") if n_rows else (lambda n=1, **kw: None)
                part = teacher_pass(model, docs, seq_len, adv, layers)
                _save_npz(f, part, cfg.data_key(name))
            phases[f"data_{name}"] = time.perf_counter() - t0
            parts.append(part)
        ds = Dataset.join(parts)
        train_chunks, held_chunks = ds.split(seed)
        train_rows, held_rows = ds.rows(train_chunks), ds.rows(held_chunks)
        # draft vocabulary: the most frequent targets of the training rows, most frequent first (ties: lower id)
        tmask = np.zeros(ds.tokens.size, bool)
        for c in train_chunks:
            tmask[ds.starts[c] + 1 : ds.starts[c] + ds.lens[c]] = True
        counts = np.bincount(ds.greedy[tmask], minlength=args.vocab_size)[: args.vocab_size]
        draft_vocab = np.argsort(-counts, kind="stable")[: min(DRAFT_VOCAB, args.vocab_size)].astype(np.int32)
        bars.log(f"teacher data: {len(np.unique(ds.groups))} document groups, {train_rows} training rows, "
                 f"{held_rows} held-out rows")

        # -- model -------------------------------------------------------------------------------------
        t0 = time.perf_counter()
        block, qtypes = base_block(g, args)
        out_norm = np.array(f32(g.tensor("output_norm.weight")), np.float32)
        emb = torch.from_numpy(np.array(f32(g.tensor("token_embd.weight")), np.float32))
        lm_head = emb if not g.has("output.weight") else torch.from_numpy(
            np.array(f32(g.tensor("output.weight")), np.float32))
        torch.manual_seed(seed)
        hidden_scale = float(np.median(ds.rms[tmask])) if tmask.any() else 1.0
        head = build_head(torch, args, block, out_norm, seq_len, seed, hidden_scale=hidden_scale, qtypes=qtypes,
                          n_features=len(layers))
        params = [p for p in head.parameters()]
        opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
        ce = _lm_head_ce(torch)
        step, history, step0 = 0, [], None
        state_file = ckpt / "state.pt"
        if resume and state_file.is_file():
            st = torch.load(state_file, map_location="cpu", weights_only=False)
            if st.get("config") == cfg.as_dict():
                head.load_state_dict(st["params"])
                opt.load_state_dict(st["optim"])
                torch.set_rng_state(st["torch_rng"])
                step, history, step0 = int(st["step"]), list(st["history"]), st.get("step0")
                bars.log(f"resuming from {state_file} at step {step}/{steps}")
            else:
                diff = [k for k, v in cfg.as_dict().items() if st.get("config", {}).get(k) != v]
                bars.log(f"{state_file}: another configuration ({', '.join(diff)} differ): training starts over")
        phases["init"] = time.perf_counter() - t0

        def save() -> None:
            _atomic_torch_save(torch, {"config": cfg.as_dict(), "step": step, "params": head.state_dict(),
                                       "optim": opt.state_dict(), "torch_rng": torch.get_rng_state(),
                                       "history": history, "step0": step0}, state_file)

        t0 = time.perf_counter()
        if step0 is None:
            head.eval()
            step0 = evaluate(torch, head, emb, lm_head, ds, held_chunks, depth=depth)
            bars.log(f"step 0: held-out acceptance {step0['acceptance']:.3f}, loss {step0['loss']:.3f}")
        phases["eval"] = time.perf_counter() - t0

        # -- training ----------------------------------------------------------------------------------
        t0 = time.perf_counter()
        head.train()
        adv = bars.bar("training the MTP head", steps, "steps")
        adv(step)
        ema = None
        done_here = 0
        consistent = True  # the parameters are those of `step` (not inside an optimizer update)
        try:
            while step < steps and (stop_after is None or done_here < stop_after):
                hn, ft, nxt, tgt, valid = (torch.from_numpy(a)
                                           for a in ds.batch(_batch_chunks(train_chunks, batch, seed, step)))
                for group in opt.param_groups:
                    group["lr"] = _lr_at(step, steps, lr)
                outs = head(hn, emb[nxt], ft, depth)
                t = tgt[valid]
                loss, pred = ce(outs[0][valid], lm_head, t)
                for d, o in enumerate(outs[1:], 1):  # depth d+1: rows p >= d chain on rows the batch holds
                    m = valid.clone()
                    m[:, :d] = False
                    loss = loss + DEPTH_WEIGHT**d * ce(o[m], lm_head, tgt[m])[0]
                opt.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(params, 1.0)
                consistent = False
                opt.step()
                history.append((step, float(loss.detach()), float((pred == t).float().mean())))
                step += 1
                done_here += 1
                consistent = True
                ema = history[-1][2] if ema is None else 0.9 * ema + 0.1 * history[-1][2]
                adv(1, loss=f"{history[-1][1]:.3f}", acc=f"{ema:.3f}")
                if step % ckpt_every == 0 or step == steps:
                    save()
        except KeyboardInterrupt:
            if consistent and done_here:
                save()
                bars.close()
                bars.log(f"interrupted: checkpoint at step {step} in {state_file}; run again to resume")
            raise
        if done_here and step % ckpt_every and step != steps:
            save()
        phases["train"] = time.perf_counter() - t0
        if step < steps:  # stopped early (stop_after): checkpointed, nothing written
            bars.close()
            return {"stopped_at": step, "steps": steps, "history": history, "phases": phases}

        # -- export and final evaluation ---------------------------------------------------------------
        t0 = time.perf_counter()
        head.eval()
        values = {k: v.detach().numpy().copy() for k, v in head.p.items()}
        tensors = export_tensors(values, qtypes)
        shapes = {gguf_name(k): v.shape for k, v in values.items()}
        written = dequantized(tensors, shapes)
        float_eval = evaluate(torch, head, emb, lm_head, ds, held_chunks, draft_vocab, depth=max(2, depth))
        with torch.no_grad():
            for k, p in head.p.items():
                p.copy_(torch.from_numpy(written[gguf_name(k)]))
        by_source = {name: evaluate(torch, head, emb, lm_head, ds, held_chunks[ds.sources[held_chunks] == i],
                                    draft_vocab, depth=max(2, depth)) for i, name in enumerate(("text", "gen"))}
        file_eval = _pool(list(by_source.values()))
        phases["eval"] += time.perf_counter() - t0
        t0 = time.perf_counter()
        tensors.append(("mtp.draft_vocab", draft_vocab, "I32"))
        seconds = time.perf_counter() - t_start
        meta = {
            "guild.mtp.base_architecture": args.arch,
            "guild.mtp.base_digest": cfg.base_digest,
            "guild.mtp.base_name": Path(path).name,
            "guild.mtp.ffn": "moe" if args.is_moe else "dense",
            "guild.mtp.train.sources": SOURCES,
            "guild.mtp.train.rows": int(train_rows),
            "guild.mtp.train.heldout_rows": int(held_rows),
            "guild.mtp.train.steps": int(steps),
            "guild.mtp.train.seq_len": int(seq_len),
            "guild.mtp.train.hidden_scale": float(hidden_scale),
            "guild.mtp.train.heldout_acceptance": float(file_eval["acceptance"]),
            "guild.mtp.train.heldout_acceptance_step0": float(step0["acceptance"]),
            "guild.mtp.train.heldout_acceptance_d2": float(file_eval["acceptance_d2"]),
            "guild.mtp.train.depth": int(depth),
            **({FEATURE_KEY: list(layers)} if layers else {}),
            "guild.mtp.train.seconds": float(seconds),
        }
        size = write_head_gguf(out_path, tensors, meta)
        phases["export"] = time.perf_counter() - t0
        bars.close()
        losses = [h[1] for h in history]
        k = max(1, min(10, len(losses) // 5))
        summary = {
            "output": str(out_path),
            "bytes": size,
            "base": str(path),
            "base_digest": cfg.base_digest,
            "document_groups": int(len(np.unique(ds.groups))),
            "rows": train_rows,
            "heldout_rows": held_rows,
            "steps": steps,
            "heldout_acceptance": file_eval["acceptance"],
            "heldout_acceptance_float": float_eval["acceptance"],
            "heldout_acceptance_step0": step0["acceptance"],
            "heldout_acceptance_d2": file_eval["acceptance_d2"],
            "heldout_acceptance_d2_gen": by_source["gen"]["acceptance_d2"],
            "feature_layers": list(layers),
            "depth": depth,
            "heldout_acceptance_text": by_source["text"]["acceptance"],
            "heldout_acceptance_gen": by_source["gen"]["acceptance"],
            "heldout_loss": file_eval["loss"],
            "heldout_loss_step0": step0["loss"],
            "draft_vocab_size": int(draft_vocab.size),
            "draft_vocab_acceptance": file_eval["draft_vocab_acceptance"],
            "draft_vocab_coverage": file_eval["draft_vocab_coverage"],
            "train_loss_first": float(np.mean(losses[:k])) if losses else None,
            "train_loss_last": float(np.mean(losses[-k:])) if losses else None,
            "threads": n_threads,
            "seconds": time.perf_counter() - t_start,
            "phases": {k: round(v, 2) for k, v in phases.items()},
            "sources": SOURCES,
            "history": history,
        }
        bars.log("phase times: " + " · ".join(f"{k} {v:.1f} s" for k, v in phases.items()))
        return {k: None if isinstance(v, float) and math.isnan(v) else v for k, v in summary.items()}
    finally:
        bars.close()
