"""
Figures of amp's container image: a warm build (nothing changed: the
engine's layer cache), the image's size, its start-up time to ready (from
``<engine> run`` to the chart's readiness probe answering 200, with the
chart's security settings and mounted config, as tests/integration/deploy/test_image.py runs
it; the median of ``--starts``), and the SBOM's package count.  The cold
build's time is what ``make image-check`` prints (a build without cache).

    .venv/bin/python -m bench.image [--starts 5]

Prints a Markdown section for bench/latest.md.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

from tests.support.imagerun import Pair, built_image, chart_container, chart_deployment, container_config, imagetool


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--starts", type=int, default=5)
    args = parser.parse_args(argv)
    image = built_image()
    warm = imagetool.build(quiet=True)
    inspected = imagetool.inspect(image)
    size = int(inspected.get("Size") or inspected.get("VirtualSize"))
    spec = chart_container(chart_deployment())
    starts = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in range(args.starts):
            pair = Pair(spec, image, Path(tmp) / str(n), container_config(spec))
            try:
                starts.append(pair.start())
            finally:
                pair.remove()
    packages = len(imagetool.sbom(image).get("components", []))
    engine = Path(imagetool.engine()).name
    print(f"- image {image} ({engine}): {size / 1e6:.0f} MB")
    print(f"- warm build (nothing changed): {warm:.1f} s")
    print(
        f"- start-up to ready (`{engine} run` to /readyz 200), median of {len(starts)}: "
        f"{statistics.median(starts):.2f} s (min {min(starts):.2f}, max {max(starts):.2f})"
    )
    print(f"- SBOM (CycloneDX, cyclonedx-py {imagetool.CYCLONEDX_VERSION}): {packages} Python packages")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
