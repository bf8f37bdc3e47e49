"""Write the parquet samples of `tests/support/parquet_samples.py` with the installed ART.

Run it once with each ART (each writes its own format):

    PYTHONPATH=. /work/venvs/py311/bin/python tests/data/make_parquet_samples.py  # ART 0.5.18
    PYTHONPATH=. /work/venvs/py313/bin/python tests/data/make_parquet_samples.py  # ART 0.5.23

ART 0.5.18 writes `art-0.5.18-format-1.parquet`; ART 0.5.23 writes
`art-0.5.23-format-2.parquet` and `art-0.5.23-format-2-exchanges.parquet`. The tests read the
sample of the format their ART does not write, and check that the sample of their own format
is what their ART's writer makes of the same groups.
"""

from __future__ import annotations

import sys
from importlib import metadata
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "support"))

from parquet_samples import write_samples  # noqa: E402


def main() -> None:
    version = metadata.version("openpipe-art")
    for path in write_samples(HERE):
        print(f"wrote {path.relative_to(HERE.parent.parent)} with ART {version}")
        if not path.name.startswith(f"art-{version}-"):
            sys.exit(f"{path.name} is named after another ART than {version}: rename the samples")


if __name__ == "__main__":
    main()
