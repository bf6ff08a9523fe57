"""`featurelab.analysis`: the feature-learning measurements of any PyTorch model (docs/analyze.md).

`analyze(model, X, Y, representations=...)` returns a `ModelAnalysis` (layers, representations, norms,
attention heads, summary); `AnalysisTracker` records it along training; `power_law_fit` is the
Clauset–Shalizi–Newman tail fit (the ``ww_alpha`` column applies it with WeightWatcher's own rules);
`weights_module`, `load_factory` and `load_inputs` are the command line's loaders. The private layout:
`layers` (the layer model by tracing), `attention` (Q/K/V per head), `spectra` (large SVDs, power law),
`weightwatcher` (its ESD and columns), `conv_operator` (a conv's operator spectrum), `representations`,
`report` (the result and its report), `core` (`analyze`), `tracker`, `loaders`.
"""

from .core import analyze
from .loaders import check_out, load_factory, load_inputs, parse_shape, weights_module
from .report import ModelAnalysis
from .spectra import PowerLawFit, power_law_fit, singular_values
from .tracker import AnalysisTracker

__all__ = [
    "analyze",
    "ModelAnalysis",
    "AnalysisTracker",
    "power_law_fit",
    "PowerLawFit",
    "singular_values",
    "weights_module",
    "load_factory",
    "load_inputs",
    "parse_shape",
    "check_out",
]
