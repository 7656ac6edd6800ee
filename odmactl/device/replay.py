"""`odmactl replay --on-device`: the replay of run/replay.py with its blocks in a real buffer on a
torch device and every iteration run there and timed (ondevice.StepProbe)."""

from __future__ import annotations

import polars as pl

from odmactl.allocator import TorchArena
from odmactl.device.ondevice import OnDeviceSpec, StepProbe, StepShape, check_fits, release_device_memory
from odmactl.run.replay import ReplayContext, run_policies
from odmactl.run.serving import serving
from odmactl.run.spec import ReplaySpec


class OnDevice:
    """run/replay.DeviceHooks for one torch device: each policy gets its own arena there (checked to
    fit first), a probe that runs its iterations, and an "on_device" section."""

    def __init__(self, spec: OnDeviceSpec) -> None:
        self.spec = spec
        self.description = "token-by-token stepping, each iteration run on " + spec.torch_device

    @staticmethod
    def shape(ctx: ReplayContext, model=None) -> StepShape:
        """The probe's tensors for `model` (the replay's, scaled): a batch of max_num_seqs decodes
        beside a step's token budget of prompt tokens, each attending to at most max_model_len."""
        return StepShape.of(model or ctx.serving.model, ctx.scheduler.max_num_seqs,
                            ctx.scheduler.batched_tokens(ctx.max_len), ctx.max_len)

    def arena(self, ctx: ReplayContext, arena_bytes: int) -> TorchArena:
        s = ctx.serving

        def need_at(model) -> tuple[int, int]:  # the pool keeps its tokens at any scale
            return arena_bytes * model.kv_bytes_per_token // s.model.kv_bytes_per_token, \
                self.shape(ctx, model).device_bytes

        check_fits(self.spec.torch_device, need_at, s.full_model, self.spec.scale)
        return TorchArena(arena_bytes, self.spec.torch_device)

    def probe(self, allocator, ctx: ReplayContext) -> StepProbe:
        return StepProbe(allocator.arena, ctx.serving.model, allocator.block_size_tokens, self.shape(ctx),
                         ctx.serving.compute_dtype,
                         kv_ranges=allocator.kv_ranges if allocator.block_size_tokens is None else None)

    def section(self, probe: StepProbe, ctx: ReplayContext) -> dict:
        s = ctx.serving
        return probe.summary(s.device, s.model, s.full_model, self.spec.scale)

    def release(self) -> None:
        release_device_memory(self.spec.torch_device)


def replay_on_device(frame: pl.DataFrame, policies: list[str], spec: ReplaySpec, on_device: OnDeviceSpec,
                     progress=None) -> dict:
    """`run_policies` on the device: the model scaled to `on_device.scale` of its layers with the
    pool's size in tokens kept, each result with an "on_device" section."""
    setup = serving(spec.device, spec.model, spec.kv_dtype, spec.kv_pool_bytes, on_device.scale)
    return run_policies(frame, policies, spec, progress=progress, device=OnDevice(on_device), setup=setup)
