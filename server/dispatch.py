"""Where a model's forward passes run: in this process (`local`) or on a Ray Serve deployment (`ray_serve`).

    mailbox ─► scheduler ─► micro-batch ─► per-session preprocess (here) ─► Forward ─► postprocess (here)
                                                                              │
                                        local: policy.predict_action_chunk ───┤
                   ray_serve: DeploymentHandle ─► PolicyDeployment replicas ──┘ (same checkpoint, same call)

Design 003's Dispatcher seam: sessions, validation, mailboxes, scheduling and the per-session processors
never leave the Zenoh-facing policy-server; only the batched `predict_action_chunk(batch, delays,
prefixes)` moves, RTC guidance included, so a Serve-backed replica returns the same actions byte for byte
as a local one for the same inputs (its replicas run the same code with the same torch threads, and the
policies' sampling noise is seeded). Ray is imported only when a manifest asks for `ray_serve`.

Backpressure: the dispatch loop waits for each forward pass, so a saturated deployment holds micro-batches
in this process's mailbox, where queue depth, load reports and capacity refusals already show it.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

log = logging.getLogger("policy_server")

FORWARD_TIMEOUT_S = 120.0  # a Serve replica that takes longer is treated as failed (the batch gets INTERNAL)


class PolicyDeployment:
    """The body of the Serve deployment: loads the checkpoint once per replica and runs the forward pass."""

    def __init__(
        self, repo_or_path: str, device: str, dtype: str, torch_threads: int, hyper_params: dict | None = None
    ):
        from server.policies.checkpoint import load_checkpoint
        from server.runtime import set_torch_threads

        os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = str(torch_threads)
        set_torch_threads(torch_threads)
        self.threads = torch_threads
        self.policy = load_checkpoint(repo_or_path, device=device, dtype=dtype).policy
        if hyper_params:  # the manifest's `model.hyper_params`, as the Zenoh-facing server applied them
            self.policy.override_hyper_params(hyper_params)
        self.policy.prepare_serving()  # e.g. `compile` without a compiler: refused as the deployment starts
        from server.runtime import LocalForward

        # as in the Zenoh-facing server: a policy replaying CUDA graphs is called from its device's one thread, and
        # Serve calls from threads of its own
        self._call = LocalForward(self.policy)

    def forward(self, batch: dict, delays: list[int], prefixes: list) -> Any:
        import torch

        from server.accel import to_device
        from server.runtime import set_torch_threads

        set_torch_threads(self.threads)  # Serve may call from a thread of its own: OpenMP's team is per thread
        device, dtype = self.policy.param_device, self.policy.param_dtype
        batch = {k: v.to(device) for k, v in batch.items()}
        prefixes = [to_device(p, device, dtype) if p is not None else None for p in prefixes]
        out = self._call(batch, delays, prefixes)
        return out.detach().to("cpu", torch.float32)


class RayServeForward:
    """The forward pass on a Ray Serve deployment of the same checkpoint."""

    backend = "ray_serve"

    def __init__(self, app_name: str, handle, ray_module, started_ray: bool):
        self.app_name, self.handle, self._ray, self._started_ray = app_name, handle, ray_module, started_ray

    @classmethod
    def deploy(
        cls,
        *,
        model_id: str,
        replica_id: str,
        repo_or_path: str,
        device: str,
        dtype: str,
        torch_threads: int,
        replicas: int,
        cpus_per_replica: float,
        gpus_per_replica: float,
        max_inflight: int,
        address: str | None,
        hyper_params: dict | None = None,
    ) -> RayServeForward:
        try:
            import ray
            from ray import serve
        except ImportError:
            raise RuntimeError(
                "dispatch.backend ray_serve needs Ray Serve: pip install 'fleet-inference[cluster]'"
            ) from None
        repo = str(Path(__file__).resolve().parents[1])
        started = False
        if not ray.is_initialized():
            address = address or os.environ.get("RAY_ADDRESS") or None
            kwargs: dict[str, Any] = {
                "logging_level": "WARNING",
                "log_to_driver": False,
                "runtime_env": {"env_vars": {"PYTHONPATH": repo}},
            }
            if address is None:  # no cluster given: a private Ray on this host, for this process
                kwargs.update(include_dashboard=False)
            ray.init(address=address, **kwargs)
            started = True
        serve.start(proxy_location="Disabled")  # no HTTP: the policy-server calls the handle
        app_name = f"fleet-{model_id}-{replica_id}-{os.getpid()}"
        deployment = serve.deployment(
            PolicyDeployment,
            name=f"policy-{model_id}",
            num_replicas=replicas,
            max_ongoing_requests=max_inflight,
            ray_actor_options={"num_cpus": cpus_per_replica, "num_gpus": gpus_per_replica},
        )
        handle = serve.run(
            deployment.bind(repo_or_path, device, dtype, torch_threads, dict(hyper_params or {})),
            name=app_name,
            route_prefix=None,
        )
        log.info(
            "forward passes of %s on Ray Serve app %s (%d replica(s), %.1f CPU %.1f GPU each, %d in flight)",
            model_id,
            app_name,
            replicas,
            cpus_per_replica,
            gpus_per_replica,
            max_inflight,
        )
        return cls(app_name, handle, ray, started)

    def __call__(self, batch, delays, prefixes):
        batch = {k: v.cpu() for k, v in batch.items()}
        prefixes = [p.cpu() if p is not None else None for p in prefixes]
        return self.handle.forward.remote(batch, list(delays), prefixes).result(timeout_s=FORWARD_TIMEOUT_S)

    def close(self) -> None:
        try:
            from ray import serve

            serve.delete(self.app_name)
        except Exception as exc:  # the cluster may be gone already
            log.warning("could not delete Serve app %s: %s", self.app_name, exc)
        if self._started_ray:
            try:
                self._ray.shutdown()
            except Exception:
                pass


def make_forward(policy, m, model_id: str, replica_id: str):
    """The manifest's `dispatch` backend for this model's policy (loaded here for its config and processors);
    `m` is the model's server.manifest.Manifest."""
    d = m.dispatch
    if d.backend == "local":
        from server.runtime import LocalForward

        return LocalForward(policy)
    device = m.model.device
    gpus = d.gpus_per_replica
    if device.startswith("cuda") and gpus == 0:
        gpus = 1.0
    return RayServeForward.deploy(
        model_id=model_id,
        replica_id=replica_id,
        repo_or_path=str(m.model.repo_or_path),
        device=device,
        dtype=m.model.dtype,
        torch_threads=m.torch_threads,
        replicas=d.replicas,
        cpus_per_replica=d.cpus_per_replica,
        gpus_per_replica=gpus,
        max_inflight=d.max_inflight,
        address=d.address,
        hyper_params=dict(m.model.hyper_params),
    )
