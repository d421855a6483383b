"""The Streamlit app, driven headless with AppTest."""

from streamlit.testing.v1 import AppTest


def test_app_loads_the_default_model_and_shows_a_continuation(embedded_model):
    app = AppTest.from_file("../app.py", default_timeout=120).run()
    assert not app.exception
    app.button[0].click().run()
    assert not app.exception
    assert "Paris" in app.get("text")[0].value
