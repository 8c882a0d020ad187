"""The models, labels and photos shipped with the runtime: data, packaged with the code so that
an installed copy (``pip install .``, not only an editable one) finds them. NOTICE.md says where
each came from and how it was made."""

from pathlib import Path

MODEL_DIR = Path(__file__).resolve().parent
