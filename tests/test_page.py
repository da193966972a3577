"""The translator page at `/`, driven in headless Chromium as a person uses it: languages, typing, swap, auto,
alternatives, attention, a file, a glossary, the API key, errors in words, a phone-sized dark window, and all of it
under a URL prefix (the app mounted at /mt) as well as at /. One server and one browser for the module.

Set NANOMT_SCREENSHOTS=DIR (e.g. docs/images) to keep the screenshots the run takes there.
"""

import contextlib
import os
import shutil
import socket
import threading
import time
from pathlib import Path

import pytest
import torch
from conftest import tiny_config

from nanomt.core.config import config_from_dict
from nanomt.training.train import train

pytest.importorskip("fastapi")
uvicorn = pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

from fastapi import FastAPI  # noqa: E402
from fastapi.testclient import TestClient  # noqa: E402
from starlette.routing import Mount  # noqa: E402

from nanomt.serve import ModelSet, ModelSpec, ServeConfig, create_app  # noqa: E402
from nanomt.serve.keys import key_line  # noqa: E402

CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")
CHROME_FLAGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1100,1000",
]
PAIRS = ("de-en", "en-de", "en-fr")  # de-fr goes through the pivot, en
KEY = "page-test-key"
SHORT = "la nuka fosur la fesa korat."  # a toy source sentence under the limited key's 60 characters
GERMAN = "Das Haus ist klein, aber wir wohnen gern dort und gehen jeden Tag in den Garten."
# Counts the coloured pixels and distinct colours of the heatmap.
CANVAS_PIXELS_JS = """
const c = document.getElementById("heatmap"), d = c.getContext("2d").getImageData(0, 0, c.width, c.height).data;
let coloured = 0; const colours = new Set();
for (let i = 0; i < d.length; i += 4) {
  const grey = Math.abs(d[i] - d[i + 1]) < 12 && Math.abs(d[i + 1] - d[i + 2]) < 12;
  if (!grey) coloured++;
  colours.add((d[i] << 16) | (d[i + 1] << 8) | d[i + 2]);
}
return [coloured, colours.size, c.width * c.height];
"""


@pytest.fixture(scope="module")
def run(toy_corpus, tmp_path_factory):
    """One tiny run, served as three language pairs."""
    torch.set_num_threads(1)
    cfg = config_from_dict(tiny_config(toy_corpus, max_steps=300, eval_every=300, save_every=300))
    return train(cfg, tmp_path_factory.mktemp("page") / "run")


@pytest.fixture(scope="module")
def lines(toy_corpus):
    return toy_corpus["test.src"].read_text().splitlines()


def models(run) -> ModelSet:
    return ModelSet.read([ModelSpec.parse(f"{pair}={run}") for pair in PAIRS], "en", None, "cpu", False)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def base(run, tmp_path_factory):
    """A server in a thread: the app at / and again under /mt (as behind a proxy with a prefix), and at /limited
    an app asking for a key allowed 3 requests a minute and 60 characters a request."""
    keys = tmp_path_factory.mktemp("keys") / "keys"
    keys.write_text(key_line(KEY, "page", req_limit=3, char_limit=60) + "\n")
    app = create_app(models(run), ServeConfig(access_log=False, max_chars=2000))
    limited = create_app(models(run), ServeConfig(access_log=False, keys_file=str(keys)))

    @contextlib.asynccontextmanager
    async def lifespan(_):
        async with app.router.lifespan_context(app), limited.router.lifespan_context(limited):
            yield

    parent = FastAPI(lifespan=lifespan, routes=[Mount("/mt", app), Mount("/limited", limited), Mount("", app)])
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(parent, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "the test server did not start"
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(30)


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    """Headless Debian Chromium through Selenium and chromedriver (no browser download), downloads allowed."""
    if not (CHROMIUM.is_file() and CHROMEDRIVER.is_file()):
        pytest.skip("the page tests need Debian's chromium and chromium-driver (apt-get install chromium-driver)")
    pytest.importorskip("selenium", reason="the page tests need selenium: pip install selenium")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    tmp = tmp_path_factory.mktemp("browser")
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in [*CHROME_FLAGS, f"--user-data-dir={tmp / 'profile'}"]:
        options.add_argument(flag)
    downloads = tmp / "downloads"
    downloads.mkdir()
    options.add_experimental_option("prefs", {"download.default_directory": str(downloads)})
    driver = webdriver.Chrome(service=Service(executable_path=str(CHROMEDRIVER)), options=options)
    driver.execute_cdp_cmd("Browser.setDownloadBehavior", {"behavior": "allow", "downloadPath": str(downloads)})
    driver.downloads = downloads
    try:
        yield driver
    finally:
        driver.quit()


class Page:
    """The page as a person sees it: pick, type, click, read."""

    def __init__(self, browser, url: str):
        from selenium.webdriver.support.ui import WebDriverWait

        self.b, self.url, self.wait = browser, url, WebDriverWait(browser, 30, poll_frequency=0.05)
        browser.get(url)
        self.wait.until(lambda d: d.execute_script("return document.body.dataset.ready === 'true'"))

    def el(self, id_: str):
        from selenium.webdriver.common.by import By

        return self.b.find_element(By.ID, id_)

    def pick(self, source: str, target: str) -> None:
        from selenium.webdriver.support.select import Select

        Select(self.el("source-lang")).select_by_visible_text(source)
        Select(self.el("target-lang")).select_by_visible_text(target)

    def options(self, id_: str) -> list[str]:
        from selenium.webdriver.support.select import Select

        return [o.text for o in Select(self.el(id_)).options]

    def seq(self) -> int:
        return int(self.el("output").get_attribute("data-seq") or 0)

    def type(self, text: str) -> str:
        """Type `text` over what is there; the translation shown once it has answered."""
        before = self.seq()
        box = self.el("source")
        self.b.execute_script("arguments[0].value = ''", box)
        box.send_keys(text)
        self.wait.until(lambda d: self.seq() > before and self.translated() == text)
        return self.output()

    def translated(self) -> str | None:
        """The source text of the translation on screen."""
        return self.b.execute_script("const c = Translate.current(); return c && c.source;")

    def output(self) -> str:
        return self.b.execute_script("return document.getElementById('output').textContent")

    def error(self, contains: str = "") -> str:
        self.wait.until(lambda d: self.el("error").is_displayed() and contains in self.el("error").text)
        return self.el("error").text

    def requested(self) -> list[str]:
        """Every URL the page has asked for (documents, scripts, styles, fetches)."""
        return self.b.execute_script(
            "return [location.href, ...performance.getEntriesByType('resource').map((e) => e.name)]"
        )

    def screenshot(self, name: str, tmp: Path) -> Path:
        path = tmp / name
        self.b.save_screenshot(str(path))
        if os.environ.get("NANOMT_SCREENSHOTS"):
            shutil.copy(path, Path(os.environ["NANOMT_SCREENSHOTS"]) / name)
        return path


def lt(base: str, q: str, source: str, target: str, **extra) -> dict:
    res = httpx.post(f"{base}/translate", json={"q": q, "source": source, "target": target, **extra}, timeout=60)
    assert res.status_code == 200, res.text
    return res.json()


def test_the_page_and_its_files_are_served_with_no_network(run):
    """/ needs only the [serve] extra: the page and its scripts come from the package, and name no other host."""
    with TestClient(create_app(models(run))) as c:
        page = c.get("/")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        assert "default-src 'self'" in page.headers["content-security-policy"]
        for name in ("page.css", "api.js", "languages.js", "translate.js", "files.js", "attention.js", "main.js"):
            assert f'"static/{name}"' in page.text  # relative: works under a prefix
            res = c.get(f"/static/{name}")
            assert res.status_code == 200 and len(res.text) > 500, name
            assert "http://" not in res.text and "https://" not in res.text, name  # no CDN, no other host
        assert "{{" not in page.text and "http" not in page.text.replace('href="docs"', "")
        assert c.get("/static/index.html").status_code == 404  # scripts and styles only
        assert c.get("/static/..%2Fpage.py").status_code == 404


@pytest.mark.slow
@pytest.mark.parametrize("prefix", ["", "/mt"])
def test_german_paragraph_file_alternatives_and_attention(browser, base, lines, prefix, tmp_path):
    """The done criterion, at / and under /mt: German -> English, a paragraph typed shows the LibreTranslate API's
    translation; a sentence clicked shows alternatives and its attention; a file picked downloads translated."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    page = Page(browser, f"{base}{prefix}/")
    assert page.options("source-lang")[:3] == ["Detect the language", "German", "English"]  # names, not codes
    page.pick("German", "English")
    # The toy language is all lower case, which no sentence splitter cuts: its sentences go a line each.
    paragraph = f"{lines[0]}\n{lines[1]}\n\n{lines[2]}"
    shown = page.type(paragraph)
    assert shown == lt(base, paragraph, "de", "en")["translatedText"]
    assert shown.count("\n") == 3, shown  # paragraphs kept
    assert page.el("counter").text == f"{len(paragraph)} / 2,000 characters"

    # A sentence, chosen by keyboard: its alternatives, then the attention of the sentence.
    sentences = browser.find_elements(By.CSS_SELECTOR, "#output .sent")
    assert len(sentences) == 3, shown
    assert sentences[2].get_attribute("data-source") == lines[2]
    sentences[0].send_keys(Keys.ENTER)
    page.wait.until(lambda d: page.el("alternatives").get_attribute("data-state") == "done")
    alternatives = [b.text for b in page.el("alternatives").find_elements(By.TAG_NAME, "button")]
    api = lt(base, lines[0], "de", "en", alternatives=3)
    assert alternatives[0] == sentences[0].text and set(api["alternatives"]) <= set(alternatives)
    assert len(alternatives) >= 2
    canvas = page.el("heatmap")
    page.wait.until(lambda d: canvas.get_attribute("data-drawn") == "true")
    att = httpx.post(f"{base}/attention", json={"text": lines[0], "source": "de", "target": "en"}, timeout=60).json()
    assert canvas.get_attribute("data-cells") == str(len(att["tgt_tokens"]) * len(att["src_tokens"]))
    coloured, colours, total = browser.execute_script(CANVAS_PIXELS_JS)
    assert coloured > 0.1 * total and colours > 8, (coloured, colours, total)
    assert len(page.options("layer")) == 1 and page.options("head")[-1] == "average"
    # Picking an alternative puts it in the translation.
    page.el("alternatives").find_elements(By.TAG_NAME, "button")[-1].click()
    assert sentences[0].text == alternatives[-1]
    if not prefix:  # the whole page, the attention of the sentence included
        height = browser.execute_script("return document.documentElement.scrollHeight")
        browser.set_window_size(1100, height + 140)
        page.wait.until(lambda d: canvas.get_attribute("data-drawn") == "true")
        page.screenshot("page-desktop.png", tmp_path)
        browser.set_window_size(1100, 1000)

    # A file, picked: its translation downloads, the same as the API's.
    page.el("files-box").find_element(By.TAG_NAME, "summary").click()
    assert "10.0 MB" in page.el("file-limits").text
    source = tmp_path / f"notes{prefix.replace('/', '-')}.txt"
    source.write_text(f"{lines[3]}\n{lines[4]}\n")
    page.el("file").send_keys(str(source))
    page.el("translate-file").click()
    link = page.el("download")
    page.wait.until(lambda d: link.is_displayed() or page.el("error").is_displayed())
    assert link.is_displayed(), page.el("error").text
    link.click()
    name = source.name.replace(".txt", ".en.txt")
    page.wait.until(lambda d: (browser.downloads / name).is_file())
    with source.open("rb") as f:
        res = httpx.post(f"{base}/translate_file", files={"file": f}, data={"source": "de", "target": "en"}).json()
    expected = httpx.get(f"{base}/download_file/{res['translatedFileUrl'].rsplit('/', 1)[1]}").content
    assert (browser.downloads / name).read_bytes() == expected
    (browser.downloads / name).unlink()

    # No request went to another host, nor (under a prefix) outside the prefix.
    assert all(url.startswith(f"{base}{prefix}/") for url in page.requested()), page.requested()
    assert not page.el("error").is_displayed()
    severe = [e["message"] for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert not severe, severe  # no script error, no request the content security policy refused


@pytest.mark.slow
def test_languages_swap_auto_pivot_and_model_state(browser, base, lines):
    page = Page(browser, f"{base}/")
    status = page.el("model-status").text
    assert "null" not in status and "not loaded yet" in status, status  # a model not used yet is said to be so
    page.pick("German", "English")
    assert page.options("target-lang") == ["English", "French (through English)"]  # the pivot, marked
    first = page.type(lines[5])
    page.wait.until(lambda d: "German → English: loaded on cpu" in page.el("model-status").text)

    # Swap: English -> German, the translation becomes the text, and is translated back.
    before = page.seq()
    page.el("swap").click()
    page.wait.until(lambda d: page.seq() > before and page.translated() == first)
    assert [page.el(i).get_attribute("value") for i in ("source-lang", "target-lang")] == ["en", "de"]
    assert page.el("source").get_attribute("value") == first
    assert page.output() == lt(base, first, "en", "de")["translatedText"]

    # auto: the detected language is shown; German to French goes through English.
    page.pick("Detect the language", "French")
    page.type(GERMAN)
    page.wait.until(lambda d: page.el("detected").text == "Detected: German.")
    assert page.output() == lt(base, GERMAN, "de", "fr")["translatedText"]
    assert "goes through English" in page.el("pivot-note").text
    page.el("output").find_element("css selector", ".sent").click()  # no one model: no attention, said in words
    page.wait.until(lambda d: "no one attention picture" in page.el("attention-note").text)


@pytest.mark.slow
def test_glossary_copy_file_errors_and_the_character_limit(browser, base, lines, tmp_path):
    page = Page(browser, f"{base}/")
    page.pick("German", "English")
    page.type(lines[6])
    page.el("copy").click()
    page.wait.until(lambda d: page.el("copy").text == "Copied")

    # A glossary goes with the request, through nanomt's API (LibreTranslate's has no glossary).
    page.el("glossary-box").find_element("css selector", "summary").click()
    before = page.seq()
    terms = [["nuka", "morp"], ["fesa", "gliv"]]  # pasted lines, a tab between the terms
    page.b.execute_script(
        "const g = document.getElementById('glossary'); g.value = arguments[0];g.dispatchEvent(new Event('input'));",
        "\n".join("\t".join(t) for t in terms),
    )
    page.wait.until(lambda d: page.seq() > before)
    body = {"text": [lines[6]], "split": True, "source": "de", "target": "en", "glossary": terms}
    expected = httpx.post(f"{base}/translate", json=body, timeout=60).json()["translations"][0]
    assert page.output() == expected
    page.el("glossary").clear()

    # Files the server would refuse are refused in words, dropped or picked.
    page.el("files-box").find_element("css selector", "summary").click()
    drop = (
        "const dt = new DataTransfer(); dt.items.add(new File([new Uint8Array(arguments[1])], arguments[0]));"
        "document.getElementById('drop').dispatchEvent(new DragEvent('drop', {dataTransfer: dt, bubbles: true}));"
        "return document.getElementById('file-status').textContent;"
    )
    assert page.b.execute_script(drop, "notes.pdf", 10).startswith("A .pdf file cannot be translated: use .txt")
    too_big = page.b.execute_script(drop, "big.txt", 11 * 2**20)
    assert too_big == "big.txt is 11.0 MB; the server takes files up to 10.0 MB.", too_big
    assert not page.el("translate-file").is_enabled()
    broken = tmp_path / "broken.docx"
    broken.write_bytes(b"not a zip archive")
    page.el("file").send_keys(str(broken))
    page.el("translate-file").click()
    message = page.error("broken.docx: ")
    assert "Traceback" not in message and "Error" not in message, message
    page.el("files-box").find_element("css selector", "summary").click()

    # Past the server's limit: said, and nothing sent.
    page.b.execute_script("const s = document.getElementById('source'); s.value = 'x'.repeat(2001);")
    page.el("source").send_keys("x")
    assert "at most 2,000" in page.error("characters")
    assert "over" in page.el("counter").get_attribute("class")


@pytest.mark.slow
def test_a_key_is_asked_for_kept_only_if_asked_and_limits_are_said_in_words(browser, base, lines):
    page = Page(browser, f"{base}/limited/")
    assert page.el("key-box").is_displayed()
    page.pick("German", "English")
    page.el("source").send_keys(SHORT)
    assert "API key" in page.error("refused")
    page.el("api-key").send_keys(KEY)
    assert browser.execute_script("return localStorage.getItem('nanomt.apiKey')") is None  # not kept unless asked
    page.el("remember-key").click()
    assert browser.execute_script("return localStorage.getItem('nanomt.apiKey')") == KEY
    page.el("remember-key").click()
    assert browser.execute_script("return localStorage.getItem('nanomt.apiKey')") is None
    # Set, not typed: a pause between keystrokes would send (and count) a request of the text so far.
    page.b.execute_script("document.getElementById('source').value = arguments[0]", SHORT)
    page.el("translate").click()
    page.wait.until(lambda d: page.translated() == SHORT)
    assert page.output() == lt(f"{base}/limited", SHORT, "de", "en", api_key=KEY)["translatedText"]  # 2 of 3
    # 413: past the key's 60 characters a request (refused before the requests are counted).
    page.b.execute_script("document.getElementById('source').value = arguments[0]", SHORT * 3)
    page.el("translate").click()
    assert "Shorten the text" in page.error("Too much at once")
    # 429: past its 3 requests a minute, with the seconds to wait.
    page.b.execute_script("document.getElementById('source').value = arguments[0]", SHORT)
    for _ in range(3):
        page.el("translate").click()
    message = page.error("Too many requests")
    assert "Wait " in message and "seconds, then try again" in message and "Traceback" not in message
    for status, words in [(503, "Wait 7 seconds"), (504, "shorter text"), (500, "tell whoever runs the server")]:
        assert words in browser.execute_script("return Api.explain(arguments[0], 'x', 7)", status)


@pytest.mark.slow
def test_a_phone_sized_dark_window(browser, base, lines, tmp_path):
    """Readable on a phone: one column, no sideways scrolling; the dark theme follows the system's."""
    browser.set_window_size(390, 844)
    browser.execute_cdp_cmd(
        "Emulation.setEmulatedMedia", {"features": [{"name": "prefers-color-scheme", "value": "dark"}]}
    )
    try:
        page = Page(browser, f"{base}/")
        page.pick("German", "English")
        page.type(f"{lines[7]} {lines[8]}")
        assert browser.execute_script("return document.documentElement.scrollWidth <= window.innerWidth")
        box, out = page.el("source").rect, page.el("output").rect
        assert out["y"] > box["y"] + box["height"]  # one column: the translation under the text
        background = browser.execute_script("return getComputedStyle(document.body).backgroundColor")
        assert background == "rgb(20, 24, 31)", background
        page.screenshot("page-phone-dark.png", tmp_path)
    finally:
        browser.execute_cdp_cmd("Emulation.setEmulatedMedia", {"features": []})
        browser.set_window_size(1100, 1000)
