"""The students' link reaches phones (ui/follow/teacher_browser.py): a page opened as this machine's own address gets a
link to the machine's address on its network, or a message saying why phones cannot reach it. Nothing here connects
anywhere (the network address is read from the kernel's route, and compared with what `hostname -I` lists)."""

import subprocess

import pytest

from ui.follow import teacher_browser
from ui.follow.teacher_browser import PUBLIC_URL_ENV, is_local, students_base
from ui.text import strings


@pytest.mark.parametrize("host", ["localhost", "LOCALHOST", "127.0.0.1", "127.3.2.1", "::1"])
def test_this_machines_own_names_are_local(host):
    assert is_local(host)


@pytest.mark.parametrize("host", ["192.168.1.20", "10.0.0.5", "class.school.example", "fd00::2", ""])
def test_other_hosts_are_not(host):
    assert not is_local(host)


def test_a_page_opened_at_a_network_address_links_students_there():
    assert students_base("http://192.168.1.20:8501/", None, {}) == ("http://192.168.1.20:8501/", None, {})


def test_the_public_address_wins_and_a_malformed_one_is_said():
    environ = {PUBLIC_URL_ENV: "https://kvscope.school.example/class"}
    assert students_base("http://localhost:8501/", None, environ) == ("https://kvscope.school.example/class", None, {})
    for bad in ("kvscope.school.example", "ftp://files.example/", "https://"):
        base, problem, fields = students_base("http://localhost:8501/", None, {PUBLIC_URL_ENV: bad})
        assert (base, problem, fields["value"]) == ("http://localhost:8501/", "follow_public_url_bad", bad)


def test_localhost_on_a_server_listening_on_loopback_only_says_phones_cannot_reach_it():
    for listens_on in ("127.0.0.1", "localhost", "::1"):
        base, problem, fields = students_base("http://localhost:8501/app/", listens_on, {})
        assert (base, problem, fields["host"]) == ("http://localhost:8501/app/", "follow_local_only", "localhost")


def test_localhost_on_a_server_listening_everywhere_links_to_the_machines_network_address():
    listed = subprocess.run(["hostname", "-I"], capture_output=True, text=True, check=True).stdout.split()
    for listens_on in (None, "", "0.0.0.0"):
        base, problem, fields = students_base("http://127.0.0.1:8501/app/", listens_on, {})
        assert problem == "follow_local_moved" and fields["address"] in listed, (base, listed)
        assert base == f"http://{fields['address']}:8501/app/"


def test_without_a_network_it_says_so(monkeypatch):
    monkeypatch.setattr(teacher_browser, "network_address", lambda: None)
    base, problem, _ = students_base("http://localhost:8501/", None, {})
    assert (base, problem) == ("http://localhost:8501/", "follow_local_no_network")


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_every_message_names_what_it_is_given(lang):
    fields = {"host": "localhost", "name": PUBLIC_URL_ENV, "address": "192.168.1.20", "value": "ftp://x"}
    for key in ("follow_local_moved", "follow_local_only", "follow_local_no_network", "follow_public_url_bad"):
        text = strings.t(key, lang, **fields).replace("\\", "")  # the fields come Markdown-escaped
        assert PUBLIC_URL_ENV in text and ("192.168.1.20" in text) == (key == "follow_local_moved"), key
