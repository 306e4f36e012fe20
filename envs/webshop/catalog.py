"""Which WebShop catalog an env plays: the original data files when given, else a stand-in.

Original files (from WebShop's own setup), looked up in `data_path`, else
`$FLYWHEEL_WEBSHOP_DIR`, else `<data_dir>/webshop`:

- `items_shuffle.json` or `items_shuffle_1000.json`: the product catalog,
- `items_ins_v2.json` / `items_ins_v2_1000.json`: attributes (+ synthetic instructions),
- `items_human_ins.json`: human instructions (the goals ETO/BPO evaluate on), optional,
- `reviews.json`: optional.

Only `items_ins_v2_1000.json` exists on the project's machines, so without a catalog
file a deterministic stand-in is synthesized from it. Every report must name which one ran:
`Catalog.name` is `CATALOG_STANDIN` or `CATALOG_ORIGINAL`. `original_data.py` reads the files, `standin.py`
builds the stand-in, and `products.py` holds what both are made of (products, goals, the catalog).
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path

from envs.data import MissingDataError, data_dir
from envs.webshop.original_data import PRODUCT_FILES, load_original
from envs.webshop.products import Catalog
from envs.webshop.standin import STANDIN_SOURCE, build_standin

ENV_VAR = "FLYWHEEL_WEBSHOP_DIR"


def webshop_dir(data_path: str | os.PathLike[str] | None = None) -> Path:
    if data_path:
        return Path(data_path).expanduser()
    if os.environ.get(ENV_VAR):
        return Path(os.environ[ENV_VAR]).expanduser()
    return data_dir() / "webshop"


def load_catalog(data_path: str | os.PathLike[str] | None = None, num_products: int | None = None) -> Catalog:
    """The catalog at `data_path` (original files if present, else the stand-in), cached."""
    return _load_cached(str(webshop_dir(data_path).resolve()), num_products)


@lru_cache(maxsize=4)
def _load_cached(folder: str, num_products: int | None) -> Catalog:
    root = Path(folder)
    product_file = next((root / f for f in PRODUCT_FILES if (root / f).exists()), None)
    if product_file is not None:
        return load_original(root, product_file, num_products=num_products)
    if (root / STANDIN_SOURCE).exists():
        return build_standin(root / STANDIN_SOURCE)
    raise MissingDataError(
        f"No WebShop data in {root}: expected {' or '.join(PRODUCT_FILES)} (original catalog) or "
        f"{STANDIN_SOURCE} (to build the stand-in). Pass data_path=... or set {ENV_VAR}."
    )
