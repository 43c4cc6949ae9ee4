"""Integrations with other libraries: transformers (``integrations.transformers``).

Its minimum version is checked here, before that module imports what older releases lack, so that naming
``ExpertsInt8Config`` under one says what to install instead of failing on an import inside transformers.
"""

from transformers import __version__ as _found  # (not `import transformers`: that name is the submodule's)
from packaging.version import Version  # (a dependency of transformers)

MIN_TRANSFORMERS = "5.16"  # (older 5.x lack PrefixChange, or their loader's converters lack force_cpu)
if Version(_found).release[:2] < Version(MIN_TRANSFORMERS).release:  # (release: 5.16.0.dev0 is 5.16 here)
    raise ImportError(f"experts_int8 needs transformers>={MIN_TRANSFORMERS}, found {_found}: "
                      f"pip install -U 'transformers>={MIN_TRANSFORMERS}'")
