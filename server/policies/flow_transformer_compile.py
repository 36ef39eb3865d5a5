"""flow_transformer under torch.compile: the compiled path that falls back to eager (`CompiledPath`), the
velocity as a CUDA-graph replay may be called (`graph_safe`), the CPU compiler check, and the batch
padding to a bucket size that keeps the compiled shapes few."""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch
from torch import Tensor

from server.policies.base import PolicyConfigError

log = logging.getLogger("server.policies.flow_transformer")  # the policy's logger: its warnings read as its own


def _pad_rows(tensor: Tensor, size: int) -> Tensor:
    """`tensor` with rows appended (copies of row 0) up to `size`; pad rows are computed and dropped."""
    missing = size - tensor.shape[0]
    if missing <= 0:
        return tensor
    return torch.cat([tensor, tensor[:1].expand(missing, *tensor.shape[1:])], dim=0)


class CompiledPath:
    """A compiled velocity network that falls back to the eager one: a call that fails compiled is run eager with
    the same inputs; if that succeeds the compile was at fault, so this path runs eager from then on, logged once
    with the reason (kept in `fallbacks`, the policy's `compile_fallbacks`); if eager fails too, the inputs were,
    and its error is raised with the compiled path kept. (Not only Dynamo's own errors: a first-run Triton or
    CUDA-graph error is the compile's too.)"""

    def __init__(self, compiled: Callable[..., Tensor], eager: Callable[..., Tensor], what: str, fallbacks: list[str]):
        self.compiled, self.eager, self.what, self.fallbacks = compiled, eager, what, fallbacks
        self.failed = False

    def __call__(self, *args: Tensor) -> Tensor:
        if self.failed:
            return self.eager(*args)
        try:
            return self.compiled(*args)
        except Exception as exc:
            out = self.eager(*args)
            self.fall_back(exc)
            return out

    def fall_back(self, exc: BaseException) -> None:
        """From now on eager: `exc` failed the compiled path where the eager network did not."""
        if not self.failed:
            self.failed = True
            self.record(self.fallbacks, self.what, exc)

    @staticmethod
    def record(fallbacks: list[str], what: str, exc: BaseException) -> None:
        reason = f"compiling {what} failed, it runs eager: {type(exc).__name__}: {str(exc)[:300]}"
        fallbacks.append(reason)
        log.warning("flow_transformer: %s", reason)


def graph_safe(
    compiled: Callable[..., Tensor], eager: Callable[..., Tensor], differentiable: Callable[..., Tensor] | None = None
) -> Callable[..., Tensor]:
    """The velocity network as the sampler may call it when `compiled` replays CUDA graphs (reduce-overhead): a
    graph replays into the same output buffers, so a no-grad call marks a new step and takes a copy of its
    output before the next replay overwrites it; the guided sampler's VJP (autograd on) would read a graph's
    output after the next step's replay, so it runs `differentiable` (a compile without CUDA graphs), else
    `eager`. (On the H200 with the VJP on the replayed graph, the guided pass failed: "accessing tensor output
    of CUDAGraphs that has been overwritten by a subsequent run".)"""
    grad_fn = differentiable or eager

    def velocity(*args: Tensor) -> Tensor:
        if torch.is_grad_enabled():
            return grad_fn(*args)
        torch.compiler.cudagraph_mark_step_begin()
        return compiled(*args).clone()

    return velocity


def check_cpu_compiler() -> None:
    """`compile` on a CPU: inductor writes C++ and builds it with the host's compiler ($CXX, else g++ on Linux);
    without one the first call would fail deep inside torch. PolicyConfigError says what to do."""
    try:
        from torch._inductor.cpp_builder import get_cpp_compiler

        get_cpp_compiler()
    except Exception as e:  # torch raises RuntimeError (none found) or an import error (a build without inductor)
        raise PolicyConfigError(
            f"flow_transformer compile on a CPU needs a C++ compiler for torch.compile's inductor ({e}); install g++ "
            "(apt install g++) or set model.hyper_params.compile: false"
        ) from None
