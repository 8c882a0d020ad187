"""Read the ImageNet class names and the sample photos out of downloaded wheels.

    pip download --no-deps -d /tmp/wheels torchvision==0.29.1 scikit-image==0.26.0
    python model_file/extract_assets.py /tmp/wheels

torchvision cannot be imported beside this project's torch, so its file is read as text and the
list literal parsed with ``ast.literal_eval`` (which evaluates literals only, never code).
"""

import ast
import sys
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent


def class_names(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as archive:
        source = archive.read("torchvision/models/_meta.py").decode("utf-8")
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == \
                "_IMAGENET_CATEGORIES":
            return ast.literal_eval(node.value)
    raise SystemExit(f"_IMAGENET_CATEGORIES not found in {wheel}")


def main(wheel_dir: str) -> None:
    folder = Path(wheel_dir)
    names = class_names(next(folder.glob("torchvision-0.29.1-*.whl")))
    assert len(names) == 1000, len(names)
    (HERE / "imagenet_classes.txt").write_text("\n".join(names) + "\n", encoding="utf-8")
    with zipfile.ZipFile(next(folder.glob("scikit_image-0.26.0-*.whl"))) as archive:
        for photo in ("astronaut.png", "chelsea.png", "coffee.png"):
            (HERE / "images" / photo).write_bytes(archive.read(f"skimage/data/{photo}"))


if __name__ == "__main__":
    main(sys.argv[1])
