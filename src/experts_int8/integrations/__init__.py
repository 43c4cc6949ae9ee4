"""Integrations with other libraries: transformers (``integrations.transformers``).

Its minimum version is checked here, before that module imports what older releases lack, so that naming
``ExpertsInt8Config`` under one says what to install instead of failing on an import inside transformers.
"""

import transformers
from packaging.version import Version

MIN_TRANSFORMERS = "5.16"  # (older 5.x lack PrefixChange, or their loader's converters lack force_cpu)
if Version(transformers.__version__) < Version(MIN_TRANSFORMERS):
    raise ImportError(f"experts_int8 needs transformers>={MIN_TRANSFORMERS}, found {transformers.__version__}: "
                      f"pip install -U 'transformers>={MIN_TRANSFORMERS}'")
