"""Entry point for Streamlit Community Cloud (main file path: cloud/streamlit_app.py).

Community Cloud installs the requirements file next to the entry point, so this folder's
requirements.txt can take PyTorch's CPU-only wheel; the app itself is the repository's.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ui.page.main import main  # noqa: E402

main()
