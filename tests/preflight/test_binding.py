"""Binding checks: --gpu-ids and CUDA_VISIBLE_DEVICES resolved the way CUDA resolves them."""

from __future__ import annotations

from musubi.preflight.checks.binding import check_binding, resolve_visible
from musubi.preflight.result import Status

from .crafted import gpu, only

GPUS = tuple(gpu(i) for i in range(4))


def _check(requested: list[int] | None, cvd: str | None):
    return check_binding(requested, resolve_visible(cvd, GPUS), len(GPUS))


def test_a_gpu_listed_twice_in_gpus_fails() -> None:
    r = only(_check([0, 1, 1], None))
    assert (r.check, r.status) == ("binding.gpus", Status.FAIL)
    assert r.found == "--gpu-ids 0,1,1 lists GPU 1 twice: two ranks would share one GPU"
    assert r.fix == "list each GPU once (--gpu-ids 0,1)"


def test_a_repeat_in_cuda_visible_devices_fails() -> None:
    r = only(_check(None, "0,0,1"))
    assert (r.check, r.status) == ("binding.visible", Status.FAIL)
    assert r.found == "CUDA_VISIBLE_DEVICES='0,0,1' lists 0 twice: CUDA stops there and also hides 1"


def test_an_unknown_entry_hides_every_gpu_after_it() -> None:
    v = resolve_visible("0,1,7,2", GPUS)
    assert v.indices == [0, 1] and v.hidden_after == ["2"]
    r = only(check_binding(None, v, 4))
    assert r.status is Status.FAIL
    assert r.found == ("CUDA_VISIBLE_DEVICES='0,1,7,2': entry '7' matches no GPU (GPUs are 0-3), so CUDA also "
                       "hides every entry after it (2)")
    assert r.fix == "remove '7' from CUDA_VISIBLE_DEVICES"


def test_an_unknown_last_entry_only_warns() -> None:
    r = only(_check(None, "0,9"))
    assert r.status is Status.WARN and "entry '9' matches no GPU" in r.found


def test_empty_cuda_visible_devices_with_gpus_requested_fails() -> None:
    r = only(_check([0, 1], ""))
    assert r.status is Status.FAIL
    assert r.found == "CUDA_VISIBLE_DEVICES='' hides every GPU but --gpu-ids asks for 0,1"
    assert r.fix == "unset CUDA_VISIBLE_DEVICES or set CUDA_VISIBLE_DEVICES=0,1"


def test_requested_gpus_outside_cuda_visible_devices_fail() -> None:
    r = only(_check([2, 3], "0,1"))
    assert r.found == "--gpu-ids 2,3 but CUDA_VISIBLE_DEVICES='0,1' hides GPU 2,3"
    assert r.fix == "set CUDA_VISIBLE_DEVICES=2,3 or unset it"


def test_mig_instances_warn() -> None:
    r = only(_check(None, "MIG-1234abcd"))
    assert r.status is Status.WARN and "names MIG instances (1)" in r.found


def test_uuid_prefixes_resolve_and_pass() -> None:
    v = resolve_visible("GPU-00000003,GPU-00000001", GPUS)
    assert v.indices == [3, 1]
    r = only(check_binding([1, 3], v, 4))
    assert r.status is Status.PASS and "exposes GPU 3,1; --gpu-ids 1,3: one rank per GPU" in r.found


def test_unset_and_hidden_on_purpose_pass() -> None:
    assert only(_check(None, None)).found == "CUDA_VISIBLE_DEVICES unset: all 4 GPU(s) visible"
    assert only(_check(None, "")).found == "CUDA_VISIBLE_DEVICES='' hides all 4 GPU(s): CPU ranks"
