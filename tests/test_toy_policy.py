"""A seventh policy is added in allocator/ terms alone: a module of its own (written here to a
temporary folder, outside the package) declares its settings class and its allocator, registers
it, and every layer (the [allocator] table, the run layer, the engine) takes it with no change to
another package."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from odmactl.allocator import ALLOCATORS, AllocatorConfig, unregister
from odmactl.core.errors import ConfigError
from odmactl.run.replay import run_policies
from odmactl.run.spec import LoadOptions, ReplaySpec

TOY = '''
from dataclasses import dataclass

from odmactl.allocator import register
from odmactl.allocator.config import PolicySettings, whole_numbers
from odmactl.allocator.contiguous import ContiguousAllocator


@dataclass(frozen=True)
class HeadroomSettings(PolicySettings):
    """The toy's one setting: the output tokens it reserves beside the prompt."""

    headroom_tokens: int = 64

    def __post_init__(self):
        whole_numbers(self, ("headroom_tokens", 1, 1 << 20))


class HeadroomAllocator(ContiguousAllocator):
    """prompt + headroom_tokens in one block; past it, a move to a block of the length so far
    plus the headroom again."""

    name = "headroom"
    settings = (HeadroomSettings,)

    def __init__(self, pool_bytes, bytes_per_token, config, arena=None, deployment=None):
        super().__init__(pool_bytes, bytes_per_token, config, arena, deployment)
        self._init_regions({"main": pool_bytes})
        self.headroom = config.headroom_tokens

    def reserve(self, request_id, prompt_tokens, predicted_output_tokens=None, uncertainty=None):
        if request_id in self._live or not 1 <= prompt_tokens <= self.max_tokens:
            self._admit(request_id, prompt_tokens)
        return self._reserve_in(self._main, "main", request_id, min(prompt_tokens + self.headroom, self.max_tokens),
                                prompt_tokens, None)

    def extend(self, allocation, total_tokens):
        if self._grow_in_place(allocation, total_tokens):
            return True
        if total_tokens > self.max_tokens:
            self.failed_extends += 1
            return False
        return self._migrate(allocation, "main", min(total_tokens + self.headroom, self.max_tokens), None, total_tokens)


register(HeadroomAllocator)
'''


@pytest.fixture
def toy(tmp_path):
    path = tmp_path / "headroom_policy.py"
    path.write_text(TOY)
    spec = importlib.util.spec_from_file_location("headroom_policy", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["headroom_policy"] = module
    spec.loader.exec_module(module)
    yield module
    unregister("headroom")
    del sys.modules["headroom_policy"]


def test_a_policy_from_its_own_module_replays_with_its_own_settings(toy, conv_sample_head):
    assert "headroom" in ALLOCATORS
    trace = conv_sample_head(300)
    import polars as pl

    frame = pl.read_parquet(trace)
    docs = {}
    for headroom in (16, 256):
        for fast in (True, False):
            spec = ReplaySpec(device="mlu370-x4", model="DeepSeek-R1-Distill-Qwen-7B", predictor="none",
                              load=LoadOptions(limit=200), fast_forward=fast)
            docs[headroom, fast] = run_policies(frame, ["headroom"], spec,
                                                tables={"allocator": {"headroom_tokens": headroom}, "scheduler": {},
                                                        "thresholds": {}, "plan": {}})
    for headroom in (16, 256):  # closed form and stepping agree for it too
        fast, slow = docs[headroom, True]["results"]["headroom"], docs[headroom, False]["results"]["headroom"]
        assert fast["metrics"] == slow["metrics"]
        assert fast["metrics"]["completed"] == 200
        assert fast["config"]["headroom_tokens"] == headroom
    small, large = (docs[h, True]["results"]["headroom"]["metrics"] for h in (16, 256))
    assert small["migrations"] > large["migrations"] > 0  # its setting reached it
    assert small["kv_utilization"] > large["kv_utilization"]


def test_its_settings_are_checked_like_the_others_and_leave_with_it(toy):
    assert AllocatorConfig(headroom_tokens=8).headroom_tokens == 8
    assert AllocatorConfig().to_mapping()["headroom_tokens"] == 64
    with pytest.raises(ConfigError, match="headroom_tokens"):
        AllocatorConfig.from_mapping({"headroom_tokens": 0}, "c.toml", "allocator")
    unregister("headroom")
    try:
        assert "headroom" not in ALLOCATORS
        with pytest.raises(ConfigError, match="unknown key"):
            AllocatorConfig.from_mapping({"headroom_tokens": 8}, "c.toml", "allocator")
    finally:
        from odmactl.allocator import register

        register(toy.HeadroomAllocator)


def test_a_setting_name_two_policies_claim_is_refused(toy):
    from dataclasses import dataclass

    from odmactl.allocator import register
    from odmactl.allocator.config import PolicySettings

    @dataclass(frozen=True)
    class Clash(PolicySettings):
        gamma: float = 0.5  # odma's

    class Other(toy.HeadroomAllocator):
        name = "other"
        settings = (Clash,)

    with pytest.raises(ConfigError, match="gamma"):
        register(Other)
    assert "other" not in ALLOCATORS


def test_a_registration_that_fails_leaves_nothing_behind(toy):
    """A policy whose settings clash, are not dataclasses or shadow AllocatorConfig's own members
    is refused whole: none of its settings classes stays registered."""
    from dataclasses import dataclass

    from odmactl.allocator import register
    from odmactl.allocator.config import PolicySettings
    from odmactl.allocator.registry import RESERVED

    @dataclass(frozen=True)
    class Fresh(PolicySettings):
        fresh_tokens: int = 1

    @dataclass(frozen=True)
    class Clash(PolicySettings):
        gamma: float = 0.5  # odma's

    @dataclass(frozen=True)
    class Shadow(PolicySettings):
        replace: int = 5  # AllocatorConfig.replace

    for settings, words in (((Fresh, Clash), "gamma"), ((Fresh, Shadow), "replace"), ("abc", "tuple"),
                            ((Fresh, Fresh.__class__), "tuple")):
        class Other(toy.HeadroomAllocator):
            name = "other"

        Other.settings = settings
        with pytest.raises(ConfigError, match=words):
            register(Other)
        assert "other" not in ALLOCATORS and "fresh_tokens" not in AllocatorConfig().to_mapping()
    with pytest.raises(ConfigError, match="no policy"):
        unregister("nope")
    public = {n for n in dir(AllocatorConfig) if not n.startswith("_")}
    assert public == set(RESERVED)  # the names no setting may take are AllocatorConfig's own
