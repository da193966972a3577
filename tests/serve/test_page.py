"""The translator page at `/`, driven in headless Chromium as a person uses it: languages, typing, swap, auto,
alternatives, attention, the sentences' confidence, a file, a glossary, the API key, errors in words, a phone-sized
dark window, and all of it under a URL prefix (the app mounted at /mt) as well as at /. One server and one browser
for the module.

Set NANOMT_SCREENSHOTS=DIR (e.g. docs/images) to keep the screenshots the run takes there.
"""

import contextlib
import os
import shutil
import threading
import time
from pathlib import Path

import pytest
import torch
from conftest import tiny_config
from servers import free_port, missing

from nanomt.core.config import config_from_dict
from nanomt.decoding import calibration as calib
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
    """One tiny run, served as three language pairs, calibrated (the confidence the page shows) on the toy corpus's
    100 validation sentences."""
    torch.set_num_threads(1)
    cfg = config_from_dict(tiny_config(toy_corpus, max_steps=300, eval_every=300, save_every=300, calibrate=True))
    out = train(cfg, tmp_path_factory.mktemp("page") / "run")
    assert (out / calib.CALIBRATION).is_file()
    return out


@pytest.fixture(scope="module")
def plain_run(run, tmp_path_factory):
    """The same model, never calibrated."""
    copy = tmp_path_factory.mktemp("plain") / "run"
    shutil.copytree(run, copy, ignore=shutil.ignore_patterns("checkpoints", calib.CALIBRATION))
    return copy


@pytest.fixture(scope="module")
def lines(toy_corpus):
    return toy_corpus["test.src"].read_text().splitlines()


def models(run, pairs=PAIRS) -> ModelSet:
    return ModelSet.read([ModelSpec.parse(f"{pair}={run}") for pair in pairs], "en", None, "cpu", False)


@pytest.fixture(scope="module")
def base(run, plain_run, tmp_path_factory):
    """A server in a thread: the app at / and again under /mt (as behind a proxy with a prefix), at /limited an app
    asking for a key allowed 3 requests a minute and 60 characters a request, at /plain the model without its
    calibration, and at /toy the model as `nanomt demo`'s toy pair src-tgt (codes no language name is known for)."""
    keys = tmp_path_factory.mktemp("keys") / "keys"
    keys.write_text(key_line(KEY, "page", req_limit=3, char_limit=60) + "\n")
    app = create_app(models(run), ServeConfig(access_log=False, max_chars=2000))
    limited = create_app(models(run), ServeConfig(access_log=False, keys_file=str(keys)))
    plain = create_app(models(plain_run), ServeConfig(access_log=False))
    toy = create_app(models(run, ("src-tgt",)), ServeConfig(access_log=False))

    @contextlib.asynccontextmanager
    async def lifespan(_):
        async with (
            app.router.lifespan_context(app),
            limited.router.lifespan_context(limited),
            plain.router.lifespan_context(plain),
            toy.router.lifespan_context(toy),
        ):
            yield

    mounts = [Mount("/mt", app), Mount("/limited", limited), Mount("/plain", plain), Mount("/toy", toy), Mount("", app)]
    parent = FastAPI(lifespan=lifespan, routes=mounts)
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
        missing("the page tests need Debian's chromium and chromium-driver (apt-get install chromium-driver)")
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


def test_the_page_and_its_files_are_served_with_no_network(toy_corpus, trained):
    """/ needs only the [serve] extra: the page and its scripts come from the package, and name no other host."""
    tiny = trained(tiny_config(toy_corpus, max_steps=10, eval_every=10, save_every=10))  # any model serves the page
    with TestClient(create_app(models(tiny))) as c:
        page = c.get("/")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        assert "default-src 'self'" in page.headers["content-security-policy"]
        names = ("page.css", "api.js", "languages.js", "translate.js", "files.js", "attention.js", "confidence.js")
        for name in (*names, "main.js"):
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
def test_a_code_no_language_name_is_known_for_is_shown_as_it_is(browser, base, lines):
    """The toy pair's codes: the browser's language names would make "src" the code of Sardinian ("sc")."""
    page = Page(browser, f"{base}/toy/")
    page.wait.until(lambda d: page.options("target-lang") == ["tgt"])
    assert page.options("source-lang") == ["Detect the language", "src"]
    page.type(lines[0])
    page.wait.until(lambda d: page.el("model-status").text == "src → tgt: loaded on cpu")


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
    assert page.b.execute_script(drop, "notes.xyz", 10).startswith("A .xyz file cannot be translated: use .txt")
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
        # The confidence's shades are the dark theme's.
        answer = {
            "calibrated": True,
            "sentences": [{"source": "s", "translation": "a b", "confidence": c} for c in (0.5, 0.1)],
        }
        browser.execute_script("Translate.render('s', 'a b a b', Confidence.of(arguments[0]))", answer)
        shades = browser.execute_script(
            "return [...document.querySelectorAll('#output .sent')].map((s) => getComputedStyle(s).backgroundColor)"
        )
        assert shades == ["rgb(74, 61, 22)", "rgb(82, 37, 42)"], shades
    finally:
        browser.execute_cdp_cmd("Emulation.setEmulatedMedia", {"features": []})
        browser.set_window_size(1100, 1000)


LEVELS = ("conf-high", "conf-medium", "conf-low")
# The translation's marks: shaded sentences, doubtful words.
MARKS_JS = "return document.getElementById('output').querySelectorAll('.conf-high, .conf-medium, .conf-low, .doubtful')"


def level(confidence: float) -> str:
    return "conf-high" if confidence >= 0.6 else "conf-medium" if confidence >= 0.4 else "conf-low"


def doubtful_titles(sentence: dict) -> list[str]:
    """The title of each doubtful word: its probability, from the next entry of `words` with that word under 0.5."""
    titles, k = [], 0
    for w in sentence["doubtful"]:
        j = next(i for i, x in enumerate(sentence["words"]) if i >= k and x["word"] == w and x["probability"] < 0.5)
        titles.append(f"word probability {sentence['words'][j]['probability']:.2f}")
        k = j + 1
    return titles


def stub_clipboard(browser) -> None:
    """navigator.clipboard.writeText keeps what it is given in window.copied."""
    browser.execute_script(
        "Object.defineProperty(navigator, 'clipboard', {configurable: true, value: "
        "{writeText: async (t) => { window.copied = t; }}});"
    )


@pytest.mark.slow
def test_each_sentence_is_shaded_by_its_confidence_and_doubtful_words_underlined(browser, base, lines, tmp_path):
    """The translation as the API's sentences: a span each, its class the confidence's level and its title the value;
    the doubtful words underlined with their probability; a legend; the text (and what Copy copies) unchanged."""
    from selenium.webdriver.common.by import By

    browser.get_log("browser")  # the earlier tests' messages: not this test's
    page = Page(browser, f"{base}/")
    page.pick("German", "English")
    text = "\n".join([lines[10], f"{lines[11]} {lines[12]}", "", *lines[13:19]])
    shown = page.type(text)
    api = lt(base, text, "de", "en", format="text", confidence=True)  # the page's request
    assert api["calibrated"] is True and isinstance(api["confidence"], float)
    assert shown == api["translatedText"]

    expected = [s for s in api["sentences"] if s["translation"]]
    spans = browser.find_elements(By.CSS_SELECTOR, "#output .sent")
    assert len(spans) == len(expected) >= 7, (shown, api["sentences"])
    for span, s in zip(spans, expected):
        classes = span.get_attribute("class").split()
        assert [c for c in classes if c in LEVELS] == [level(s["confidence"])], (classes, s["confidence"])
        assert span.get_attribute("title").startswith(f"confidence {s['confidence']:.2f}")
        assert span.get_attribute("textContent") == s["translation"]
        assert span.get_attribute("data-source") == s["source"]
        doubtful = span.find_elements(By.CSS_SELECTOR, ".doubtful")
        assert [d.get_attribute("textContent") for d in doubtful] == s["doubtful"], s
        assert [d.get_attribute("title") for d in doubtful] == doubtful_titles(s)
    assert any(s["doubtful"] for s in expected)  # the test sees some underlined
    shades = {
        c: browser.execute_script("return getComputedStyle(arguments[0]).backgroundColor", span)
        for span, c in ((span, level(s["confidence"])) for span, s in zip(spans, expected))
    }
    assert shades.get("conf-high", "rgba(0, 0, 0, 0)") == "rgba(0, 0, 0, 0)", shades  # high: not shaded
    assert all(v != "rgba(0, 0, 0, 0)" for c, v in shades.items() if c != "conf-high"), shades
    underline = browser.execute_script(
        "return getComputedStyle(document.querySelector('#output .doubtful')).textDecorationStyle"
    )
    assert underline == "wavy"

    legend = page.el("confidence-legend")
    assert legend.is_displayed() and not page.el("confidence-none").is_displayed()
    assert "high" in legend.text and "low" in legend.text and "doubtful word" in legend.text
    page.screenshot("page-confidence.png", tmp_path)

    # Copy copies the text, not the marks.
    stub_clipboard(browser)
    page.el("copy").click()
    page.wait.until(lambda d: page.el("copy").text == "Copied")
    assert browser.execute_script("return window.copied") == api["translatedText"]

    # A click on an underlined word is a click on its sentence: the alternatives and attention of it.
    owner = next(span for span, s in zip(spans, expected) if s["doubtful"])
    owner.find_element(By.CSS_SELECTOR, ".doubtful").click()
    page.wait.until(lambda d: page.el("alternatives").get_attribute("data-state") == "done")
    assert "selected" in owner.get_attribute("class").split()
    assert page.el("sentence-source").text == owner.get_attribute("data-source")
    page.wait.until(lambda d: page.el("heatmap").get_attribute("data-drawn") == "true")
    # An alternative picked: its text, no longer the marks of the old one; the first (the translation) puts them back.
    buttons = page.el("alternatives").find_elements(By.TAG_NAME, "button")
    buttons[-1].click()
    assert owner.get_attribute("textContent") == buttons[-1].text
    assert not owner.find_elements(By.CSS_SELECTOR, ".doubtful")
    assert not set(owner.get_attribute("class").split()) & set(LEVELS)
    buttons[0].click()
    assert owner.find_elements(By.CSS_SELECTOR, ".doubtful")
    assert page.output() == api["translatedText"]
    severe = [e["message"] for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert not severe, severe


@pytest.mark.slow
def test_no_calibration_is_said_in_one_line_and_a_refusal_leaves_the_translation_plain(browser, base, lines):
    """A model without calibration: the line saying so, nothing shaded or underlined. A server refusing the
    confidence field (400): asked again without it, the translation shown, no legend. Server text is never HTML."""
    from selenium.webdriver.common.by import By

    page = Page(browser, f"{base}/plain/")
    page.pick("German", "English")
    text = f"{lines[20]}\n{lines[21]}"
    shown = page.type(text)
    api = lt(f"{base}/plain", text, "de", "en", format="text", confidence=True)
    assert api["calibrated"] is False and api.get("confidence") is None  # null: left out of the answer
    assert shown == api["translatedText"]
    notice = page.el("confidence-none")
    assert notice.is_displayed() and not page.el("confidence-legend").is_displayed()
    assert notice.text == "This model has no calibration: no confidence shown (nanomt calibrate fits one)"
    assert len(browser.find_elements(By.CSS_SELECTOR, "#output .sent")) == 2
    assert browser.execute_script(MARKS_JS) == []
    assert all(s.get_attribute("data-confidence") is None for s in page.b.find_elements(By.CSS_SELECTOR, ".sent"))

    # A server that refuses the field: the same translation, no marks, no legend, no error.
    page = Page(browser, f"{base}/")
    browser.execute_script(
        "const real = window.fetch; window.refused = 0;"
        "window.fetch = (url, opts = {}) => {"
        "  if (typeof opts.body === 'string' && JSON.parse(opts.body).confidence) {"
        "    window.refused++;"
        "    return Promise.resolve(new Response(JSON.stringify({error: 'confidence: not here'}), "
        "    {status: 400, headers: {'Content-Type': 'application/json'}})); }"
        "  return real(url, opts); };"
    )
    page.pick("German", "English")
    shown = page.type(text)
    assert browser.execute_script("return window.refused") >= 1
    assert shown == lt(base, text, "de", "en")["translatedText"]
    assert browser.execute_script(MARKS_JS) == [] and len(browser.find_elements(By.CSS_SELECTOR, "#output .sent")) == 2
    assert not page.el("confidence-legend").is_displayed() and not page.el("confidence-none").is_displayed()
    assert not page.el("error").is_displayed()

    # Markup in a translation is text: no element made of it, the text kept to the character.
    evil = '<img src=x onerror="window.owned=1"> ok <b>x</b>'
    answer = {
        "translatedText": evil,
        "calibrated": True,
        "sentences": [
            {
                "source": "s",
                "translation": evil,
                "confidence": 0.2,
                "confidence_raw": -2.0,
                "low": None,
                "words": [{"word": "ok", "probability": 0.3}],
                "doubtful": ["ok"],
            }
        ],
    }
    browser.execute_script("Translate.render('s', arguments[0].translatedText, Confidence.of(arguments[0]))", answer)
    assert page.output() == evil
    assert not browser.find_elements(By.CSS_SELECTOR, "#output img, #output b")
    assert browser.find_element(By.CSS_SELECTOR, "#output .sent.conf-low .doubtful").get_attribute("title") == (
        "word probability 0.30"
    )
    assert browser.execute_script("return window.owned") is None
