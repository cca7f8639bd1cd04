"""The planner: parallel layouts on the bandwidth hierarchy, predicted without a GPU (no torch here)."""

from musubi.plan.catalog import GPU, get_gpu, gpu_names, load_catalog
from musubi.plan.cluster import Cluster, make_cluster
from musubi.plan.efficiency import DEFAULT_EFFICIENCY, Efficiency
from musubi.plan.errors import PlanError
from musubi.plan.layout import Layout, parse_layout, resolve_layout
from musubi.plan.memory import MemoryBreakdown, estimate_memory, estimate_memory_gib, largest_micro_batch
from musubi.plan.predict import Prediction, predict
from musubi.plan.spec import GenericSpec, ModelSpec, TransformerSpec, load_spec, preset

__all__ = [
    "DEFAULT_EFFICIENCY", "GPU", "Cluster", "Efficiency", "GenericSpec", "Layout", "MemoryBreakdown",
    "ModelSpec", "PlanError", "Prediction", "TransformerSpec", "estimate_memory", "estimate_memory_gib",
    "get_gpu", "gpu_names", "largest_micro_batch", "load_catalog", "load_spec", "make_cluster", "parse_layout", "predict", "preset",
    "resolve_layout",
]
