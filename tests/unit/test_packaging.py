"""What a non-editable install of the project holds (pip install ., the image's install):
every app of the product, and the data files its apps read at run time. Until issue 42 the
package list named five of the seven apps and no data file, so an installed anex lacked the
realtime and OpenAI apps and the catalog."""

from __future__ import annotations

import fnmatch
import tomllib

from tests.product import PRODUCT_APPS, ROOT

SETUPTOOLS = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def test_every_app_of_the_product_is_packaged() -> None:
    included = SETUPTOOLS["packages"]["find"]["include"]
    missing = [app for app in PRODUCT_APPS
               if not any(fnmatch.fnmatchcase(app, pattern) for pattern in included)]
    assert not missing, f"pyproject.toml's [tool.setuptools.packages.find] leaves out {missing}"


def test_every_data_file_inside_an_app_is_package_data() -> None:
    declared = SETUPTOOLS.get("package-data", {})
    unpackaged = []
    for app in PRODUCT_APPS:
        for path in (ROOT / app).rglob("*"):
            if not path.is_file() or path.suffix in (".py", ".pyc") \
                    or "__pycache__" in path.parts:
                continue
            inside = path.relative_to(ROOT / app).as_posix()
            if not any(fnmatch.fnmatchcase(inside, pattern) for pattern in declared.get(app, ())):
                unpackaged.append(path.relative_to(ROOT).as_posix())
    assert not unpackaged, (
        f"{unpackaged}: data the product reads is not in pyproject.toml's "
        "[tool.setuptools.package-data], so a non-editable install lacks it")
