"""Machine profiles: what the cost model needs to know about a cluster.

A profile is a YAML file (``axonn/planner/profiles/<name>.yaml`` for the bundled ones, or any
path a user passes) holding one :class:`MachineProfile`. Units are chosen to match how the
figures are usually quoted: TFLOP/s, GB/s (10^9 bytes), GiB of memory, microseconds.

Bandwidth conventions used by the cost model (:mod:`axonn.planner.model`):

* ``intra_node_gbps`` is the bandwidth one GPU achieves in a ring collective whose members are
  all inside one node (NCCL/RCCL "bus bandwidth").
* ``inter_node_gbps`` is the injection bandwidth of a whole node (all its NICs together). A
  collective that crosses nodes shares it between the node's GPUs that talk at the same time.

At-scale terms (each neutral at its default, so a profile without them predicts as before; see
``docs/planner.md`` for their sources and ``calibrate --sweep`` for measuring them):

* ``intra_node_half_bw_mbytes`` / ``inter_node_half_bw_mbytes``: buffer size (MB, 10^6 bytes) at which a
  collective inside / across nodes reaches half its large-message bus bandwidth (0: every size at full);
* ``collective_launch_us``: fixed cost of one collective call (kernel launch, proxy thread, the
  first synchronisation), paid once per call on top of the per-hop latency;
* ``nodes_per_group`` and ``global_taper``: nodes in one full-bisection domain (dragonfly group, fat-tree
  pod; 0 = the whole machine is one) and the fraction of a node's injection bandwidth its traffic gets
  on the links between domains when every node sends at once (1 = no taper).
"""
from __future__ import annotations

import dataclasses
import numbers
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import yaml

PROFILE_DIR = Path(__file__).with_name("profiles")

GIB = 1024**3

#: the at-scale terms of a profile and the values that switch them off (the model without them)
SCALE_TERMS_NEUTRAL: dict[str, Any] = {"intra_node_half_bw_mbytes": 0.0, "inter_node_half_bw_mbytes": 0.0,
                                       "collective_launch_us": 0.0, "nodes_per_group": 0, "global_taper": 1.0}


@dataclass(frozen=True)
class MachineProfile:
    """Per-GPU and per-node figures of one machine (see module docstring for conventions)."""

    name: str
    gpus_per_node: int
    memory_gib: float
    peak_tflops: float
    measured_tflops: float
    intra_node_gbps: float
    inter_node_gbps: float
    intra_node_latency_us: float = 5.0
    inter_node_latency_us: float = 10.0
    hbm_gbps: float = 2000.0
    gemm_ref_dim: int = 8192
    gemm_half_dim: float = 128.0
    attention_efficiency: float = 0.5
    usable_memory_fraction: float = 0.92
    reserved_gib: float = 2.0
    intra_node_half_bw_mbytes: float = 0.0
    inter_node_half_bw_mbytes: float = 0.0
    collective_launch_us: float = 0.0
    nodes_per_group: int = 0
    global_taper: float = 1.0
    description: str = ""
    gpu: str = ""

    def __post_init__(self) -> None:
        for f in fields(self):  # a YAML `memory_gib: "80"` or `80 GiB` is a string: say so, not a TypeError
            v = getattr(self, f.name)
            if f.type in ("int", "float") and (isinstance(v, bool) or not isinstance(v, numbers.Real)):
                raise ValueError(f"machine profile {self.name!r}: {f.name} must be a number, got {v!r}")
            if f.type == "int" and not isinstance(v, numbers.Integral):
                raise ValueError(f"machine profile {self.name!r}: {f.name} must be an integer, got {v!r}")
        for f in ("gpus_per_node", "memory_gib", "peak_tflops", "measured_tflops",
                  "intra_node_gbps", "inter_node_gbps", "hbm_gbps", "gemm_ref_dim"):
            if not getattr(self, f) > 0:
                raise ValueError(f"machine profile {self.name!r}: {f} must be > 0, got {getattr(self, f)!r}")
        if self.measured_tflops > self.peak_tflops * 1.0001:
            raise ValueError(f"machine profile {self.name!r}: measured_tflops {self.measured_tflops} "
                             f"exceeds peak_tflops {self.peak_tflops}")
        if not 0 < self.usable_memory_fraction <= 1:
            raise ValueError(f"machine profile {self.name!r}: usable_memory_fraction must be in (0, 1]")
        if not 0 < self.global_taper <= 1:
            raise ValueError(f"machine profile {self.name!r}: global_taper must be in (0, 1], "
                             f"got {self.global_taper!r}")
        for f in ("intra_node_half_bw_mbytes", "inter_node_half_bw_mbytes", "collective_launch_us", "nodes_per_group"):
            if getattr(self, f) < 0:
                raise ValueError(f"machine profile {self.name!r}: {f} must be >= 0, got {getattr(self, f)!r}")

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gib * GIB)

    @property
    def usable_memory_bytes(self) -> float:
        """Memory the planner lets a rank use: ``memory·usable_fraction − reserved``."""
        return self.memory_gib * GIB * self.usable_memory_fraction - self.reserved_gib * GIB

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @staticmethod
    def neutral_scale_terms() -> dict[str, Any]:
        """The at-scale terms' neutral values: with them the cost model is the one without those terms."""
        return dict(SCALE_TERMS_NEUTRAL)


def known_profiles() -> list[str]:
    """Names of the bundled profiles (``frontier``, ``alps``, ...)."""
    return sorted(p.stem for p in PROFILE_DIR.glob("*.yaml"))


def profile_from_dict(data: dict[str, Any], source: str = "<dict>") -> MachineProfile:
    """Build a profile from a mapping; unknown keys and missing required keys raise ``ValueError``."""
    if not isinstance(data, dict):
        raise ValueError(f"{source}: a machine profile must be a YAML mapping, got {type(data).__name__}")
    names = {f.name for f in fields(MachineProfile)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ValueError(f"{source}: unknown profile keys {unknown}; valid keys: {sorted(names)}")
    required = [f.name for f in fields(MachineProfile)
                if f.default is dataclasses.MISSING and f.name not in data and f.name != "name"]
    if required:
        raise ValueError(f"{source}: machine profile lacks required keys {required}")
    data = dict(data)
    data.setdefault("name", Path(source).stem if source != "<dict>" else "custom")
    return MachineProfile(**data)


def _read_yaml(path: Path) -> Any:
    """A profile file, parsed; a YAML syntax error is a ``ValueError`` naming the file, not a traceback."""
    try:
        with open(path) as f:
            return yaml.safe_load(f)
    except yaml.YAMLError as e:
        raise ValueError(f"machine profile file {str(path)!r} is not valid YAML: {' '.join(str(e).split())}") from None


def load_profile(machine: str | Path | MachineProfile) -> MachineProfile:
    """Load a bundled profile by name, or a user profile from a YAML path.

    Raises ``ValueError`` (``PlanError`` when called through the planner) naming the known
    profiles when ``machine`` is neither.
    """
    if isinstance(machine, MachineProfile):
        return machine
    text = str(machine)
    path = Path(text).expanduser()
    if text.endswith((".yaml", ".yml")) or path.is_file():
        if not path.is_file():
            raise ValueError(f"machine profile file {text!r} does not exist; known machines: "
                             f"{', '.join(known_profiles())}")
        return profile_from_dict(_read_yaml(path), source=str(path))
    bundled = PROFILE_DIR / f"{text}.yaml"
    if bundled.is_file():
        return profile_from_dict(_read_yaml(bundled), source=str(bundled))
    raise ValueError(f"unknown machine {text!r}: known machines are {', '.join(known_profiles())} "
                     f"(or pass the path of a profile YAML, e.g. one written by "
                     f"`python -m axonn.planner calibrate --out profile.yaml`)")


def save_profile(profile: MachineProfile, path: str | Path, header: str = "") -> Path:
    """Write ``profile`` as YAML (with an optional comment ``header``) and return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    body = yaml.safe_dump(profile.to_dict(), sort_keys=False)
    comment = "".join(f"# {line}\n" for line in header.splitlines()) if header else ""
    path.write_text(comment + body)
    return path
