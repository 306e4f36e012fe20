"""Dagster helpers: partitions, fail-once policy, concurrency slots.

The project uses a few of Dagster's beta and preview APIs on purpose (the multi-dimensional partition mappings
between benchmark and (benchmark, k) assets, asset checks over those partitions); their warnings are silenced
here, which every path to the definitions imports first (`dagster dev`, `dagster asset materialize`, the CLI,
the tests), so a command prints what matters. Any other beta or preview API still warns.
"""

import warnings

ON_PURPOSE = ("MultiPartitionMapping", "MultiToSingleDimensionPartitionMapping", "partitions_def on an AssetCheckSpec")
for _api in ON_PURPOSE:
    warnings.filterwarnings("ignore", message=rf".*{_api}`? is currently in (beta|preview)")
