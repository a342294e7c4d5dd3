"""Campaign execution: the Ray campaign driver, run supervisors, sandbox backends (a local process, a Kubernetes
pod), and the Kubernetes operator that turns Campaign and Run resources into the same runs."""

if __name__ == "operator":  # pragma: no cover - depends on how Python was started
    # This folder installs as `labkube.operator`. Only when a checkout's root is on sys.path
    # (`python -m ...` run from the checkout) is it found as the top-level `operator` module,
    # shadowing the standard library's. Become the standard library's module in that case.
    import os as _os

    _stdlib = _os.path.join(_os.path.dirname(_os.__file__), "operator.py")
    with open(_stdlib, encoding="utf-8") as _fh:
        exec(compile(_fh.read(), _stdlib, "exec"))
    del _os, _stdlib, _fh
else:
    from typing import TYPE_CHECKING, Any

    if TYPE_CHECKING:
        from labkube.operator.campaign_run import CampaignError, launch, plan_campaign
        from labkube.operator.driver_errors import DriverError
        from labkube.tasks import TaskError

    __all__ = ["CampaignError", "DriverError", "TaskError", "launch", "plan_campaign"]

    def __getattr__(name: str) -> Any:
        """The public names import their modules on first use, not with the package: the agent zygote
        (`agent_zygote`, a module of this package) must not import Ray, whose exit handler would then run in every
        run it forks (about 100 ms each, importing `ray.dag`)."""
        if name in ("CampaignError", "launch", "plan_campaign"):
            from labkube.operator import campaign_run

            return getattr(campaign_run, name)
        if name == "DriverError":
            from labkube.operator.driver_errors import DriverError

            return DriverError
        if name == "TaskError":
            from labkube.tasks import TaskError

            return TaskError
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
