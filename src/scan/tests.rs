use super::*;

/// A token in owned form, with adjacent text joined, for comparisons.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Tok {
    Text(String),
    Open(String, Vec<(String, String)>),
    SelfClosing(String, Vec<(String, String)>),
    Close(String),
    Comment(String),
    CData(String),
    Special(String),
    Unfinished(String),
    TooLong,
}

#[derive(Default)]
struct Collect {
    toks: Vec<Tok>,
    /// Every span seen, to check coverage.
    spans: Vec<Span>,
    /// Text not yet pushed as a token (adjacent text is joined byte-wise:
    /// a chunk may end inside a character).
    text: Vec<u8>,
}

impl Collect {
    fn flush(&mut self) {
        if !self.text.is_empty() {
            self.toks.push(Tok::Text(s(&self.text)));
            self.text.clear();
        }
    }

    fn done(mut self) -> Collect {
        self.flush();
        self
    }
}

fn s(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

impl TokenSink for Collect {
    fn token(&mut self, token: Token<'_>) {
        if !matches!(token, Token::Text { .. }) {
            self.flush();
        }
        let tok = match token {
            Token::Text { span, bytes } => {
                self.spans.push(span);
                self.text.extend_from_slice(bytes);
                return;
            }
            Token::Tag(t) => {
                self.spans.push(t.span);
                let attrs = t.attrs().map(|a| (s(a.name), s(a.value))).collect();
                match t.kind {
                    TagKind::Open => Tok::Open(s(t.name), attrs),
                    TagKind::SelfClosing => Tok::SelfClosing(s(t.name), attrs),
                    TagKind::Close => Tok::Close(s(t.name)),
                }
            }
            Token::Comment { span, body, .. } => {
                self.spans.push(span);
                Tok::Comment(s(body))
            }
            Token::CData { span, body, .. } => {
                self.spans.push(span);
                Tok::CData(s(body))
            }
            Token::Special { span, name, .. } => {
                self.spans.push(span);
                Tok::Special(s(name))
            }
            Token::Unfinished { span, raw, .. } => {
                self.spans.push(span);
                Tok::Unfinished(s(raw))
            }
            Token::Notice(_) => Tok::TooLong,
        };
        self.toks.push(tok);
    }
}

fn scan_chunks(chunks: &[&[u8]], limits: ScanLimits) -> Collect {
    let mut c = Collect::default();
    let mut sc = Scanner::new(limits);
    for ch in chunks {
        sc.feed(ch, &mut c);
    }
    sc.finish(&mut c);
    c.done()
}

fn scan(input: &str) -> Vec<Tok> {
    scan_chunks(&[input.as_bytes()], ScanLimits::default()).toks
}

/// The token list is the same for the whole input, for every split into
/// two and three pieces, and byte by byte; and spans tile the input.
fn check_splits(input: &[u8]) -> Vec<Tok> {
    let whole = scan_chunks(&[input], ScanLimits::default());
    let mut covered = 0;
    for sp in &whole.spans {
        assert_eq!(sp.start, covered, "spans must tile the input: {input:?}");
        covered = sp.end;
    }
    assert_eq!(covered, input.len());
    for i in 0..=input.len() {
        let two = scan_chunks(&[&input[..i], &input[i..]], ScanLimits::default());
        assert_eq!(two.toks, whole.toks, "split at {i} of {:?}", s(input));
        for j in i..=input.len() {
            let three = scan_chunks(&[&input[..i], &input[i..j], &input[j..]], ScanLimits::default());
            assert_eq!(three.toks, whole.toks, "split at {i},{j} of {:?}", s(input));
        }
    }
    let bytes: Vec<&[u8]> = input.chunks(1).collect();
    assert_eq!(scan_chunks(&bytes, ScanLimits::default()).toks, whole.toks);
    whole.toks
}

fn text(t: &str) -> Tok {
    Tok::Text(t.into())
}
fn open(n: &str) -> Tok {
    Tok::Open(n.into(), vec![])
}
fn close(n: &str) -> Tok {
    Tok::Close(n.into())
}

#[test]
fn text_and_tags() {
    assert_eq!(
        check_splits(b"a<thought>b</thought>c"),
        [text("a"), open("thought"), text("b"), close("thought"), text("c")]
    );
}

/// Simple tags whole in a chunk are read in place: the hold buffer is
/// never used for them (it is for a tag with attributes, or one cut off).
#[test]
fn simple_tags_are_read_in_place() {
    let mut c = Collect::default();
    let mut sc = Scanner::default();
    sc.feed(b"<status_bar><hp>41</hp><br/>x</status_bar>", &mut c);
    assert_eq!(sc.held_capacity(), 0);
    assert_eq!(c.done().toks.len(), 7);
    for held in [&b"<hp max=\"9\">"[..], b"<h"] {
        let mut sc = Scanner::default();
        sc.feed(held, &mut Collect::default());
        assert!(sc.held_capacity() > 0, "{held:?}");
    }
    // At the marker limit the machine decides, as for any tag.
    let limits = ScanLimits { max_marker_len: 4, max_comment_len: 24 };
    assert_eq!(scan_chunks(&[b"<abc>"], limits).toks, [Tok::Open("abc".into(), Vec::new())]);
    assert_eq!(scan_chunks(&[b"<abcd>"], limits).toks, [Tok::TooLong, text("<abcd>")]);
}

#[test]
fn attributes_quoted_unquoted_and_bare() {
    let toks = check_splits(br#"<media type="image" src='a b.png' alt=x hidden/>"#);
    assert_eq!(
        toks,
        [Tok::SelfClosing(
            "media".into(),
            vec![
                ("type".into(), "image".into()),
                ("src".into(), "a b.png".into()),
                ("alt".into(), "x".into()),
                ("hidden".into(), "".into()),
            ]
        )]
    );
    // A `>` inside a quoted value does not end the tag.
    assert_eq!(scan(r#"<t a="x>y">"#), [Tok::Open("t".into(), vec![("a".into(), "x>y".into())])]);
    // An unquoted value ending in `/` right before `>` is a self-closing tag.
    assert_eq!(scan("<media src=a.png/>"), [Tok::SelfClosing("media".into(), vec![("src".into(), "a.png".into())])]);
}

#[test]
fn padded_tags() {
    assert_eq!(check_splits(b"< content >x</ content >"), [open("content"), text("x"), close("content")]);
    let mut c = Collect::default();
    let mut sc = Scanner::default();
    sc.feed(b"< content >", &mut c);
    assert_eq!(c.done().toks, [open("content")]);
}

#[test]
fn comments_cdata_special() {
    assert_eq!(
        check_splits(b"a<!-- x -- y -->b<![CDATA[<x>]]]>c<|[REQUEST_TOOL]|>d"),
        [
            text("a"),
            Tok::Comment(" x -- y ".into()),
            text("b"),
            Tok::CData("<x>]".into()),
            text("c"),
            Tok::Special("REQUEST_TOOL".into()),
            text("d"),
        ]
    );
    assert_eq!(scan("<| [END_TOOL] |>"), [Tok::Special("END_TOOL".into())]);
    assert_eq!(scan("<|im_end|>"), [Tok::Special("im_end".into())]);
    assert_eq!(scan("<!---->"), [Tok::Comment("".into())]);
}

#[test]
fn prose_with_angle_brackets_is_text() {
    // `a < b and 5 > 3` is a well-formed tag `b` to the scanner; the
    // machine keeps non-registry tags as text (see machine tests).
    assert_eq!(
        scan("a < b and 5 > 3."),
        [text("a "), Tok::Open("b".into(), vec![("and".into(), "".into()), ("5".into(), "".into())]), text(" 3.")]
    );
    for input in ["a < b, 5 > 3.", "x<3 y", "a <= b", "<<>>", "1 <2", "<!DOCTYPE html>", "<|| x", "a <- b", "x<<<<<3 y"]
    {
        let toks = check_splits(input.as_bytes());
        assert_eq!(toks, [text(input)], "{input}");
    }
}

#[test]
fn a_lt_inside_a_candidate_ends_it() {
    // The first `<` was text; the second starts a real tag.
    assert_eq!(check_splits(b"a < b<content>"), [text("a < b"), open("content")]);
    // A run of `<`: all but the last are text.
    assert_eq!(check_splits(b"<<<<<content>"), [text("<<<<"), open("content")]);
    assert_eq!(check_splits(b"<x y=\"<content>"), [text("<x y=\""), open("content")]);
}

#[test]
fn utf8_names_and_text() {
    assert_eq!(check_splits("<状态栏>好</状态栏>".as_bytes()), [open("状态栏"), text("好"), close("状态栏")]);
}

#[test]
fn unfinished_marker_at_eof() {
    assert_eq!(scan("hi</cont"), [text("hi"), Tok::Unfinished("</cont".into())]);
    assert_eq!(scan("<!-- never closed"), [Tok::Unfinished("<!-- never closed".into())]);
    assert_eq!(scan("x <"), [text("x "), Tok::Unfinished("<".into())]);
}

#[test]
fn marker_limit_releases_text() {
    let limits = ScanLimits { max_marker_len: 16, max_comment_len: 32 };
    let long_tag = format!("<content a=\"{}\">", "x".repeat(40));
    let c = scan_chunks(&[long_tag.as_bytes()], limits);
    assert_eq!(c.toks[0], Tok::TooLong);
    assert_eq!(c.toks[1], text(&long_tag));
    let long_comment = format!("<!--{}-->", "y".repeat(100));
    let c = scan_chunks(&[long_comment.as_bytes()], limits);
    assert_eq!(c.toks[0], Tok::TooLong);
    assert_eq!(c.toks[1], text(&long_comment));
}

#[test]
fn memory_stays_bounded_on_hostile_input() {
    let limits = ScanLimits { max_marker_len: 64, max_comment_len: 256 };
    let mut sc = Scanner::new(limits);
    let mut sink = Collect::default();
    // A MiB of `<`, an endless tag, an endless comment, fed in odd chunks.
    let inputs: [Vec<u8>; 3] = [
        vec![b'<'; 1 << 20],
        [b"<content ".as_slice(), &b"a=b ".repeat(1 << 18)].concat(),
        [b"<!--".as_slice(), &b"-x".repeat(1 << 19)].concat(),
    ];
    for input in &inputs {
        for chunk in input.chunks(4093) {
            sc.feed(chunk, &mut sink);
            assert!(sc.held_len() <= 256, "held {}", sc.held_len());
            assert!(sc.held_capacity() <= 4096, "capacity {}", sc.held_capacity());
            sink.toks.clear();
            sink.spans.clear();
            sink.text.clear();
        }
    }
}

/// What `advance` reads as a run (a name, a quoted value, a comment or
/// CDATA body) is what `step` reads byte by byte: from every candidate,
/// one byte leaves the scanner where one step of the grammar leaves it.
#[test]
fn runs_are_the_steps() {
    use Candidate::*;
    // Each candidate with what the scanner holds when it stands there.
    let mut cases: Vec<(Candidate, &[u8])> = vec![
        (Lt, b"<"),
        (LtSpace, b"< "),
        (Name, b"<x"),
        (AfterName, b"<x "),
        (AttrName, b"<x a"),
        (AfterAttrName, b"<x a "),
        (BeforeValue, b"<x a="),
        (Quoted(b'"'), b"<x a=\""),
        (Quoted(b'\''), b"<x a='"),
        (Bare, b"<x a=v"),
        (SelfClose, b"<x /"),
        (CloseSlash, b"</"),
        (CloseName, b"</x"),
        (CloseAfterName, b"</x "),
        (Bang, b"<!"),
        (BangDash, b"<!-"),
        (Comment(0), b"<!--"),
        (Comment(1), b"<!---"),
        (Comment(2), b"<!----"),
        (Cdata(0), b"<![CDATA["),
        (Cdata(1), b"<![CDATA[]"),
        (Cdata(2), b"<![CDATA[]]"),
        (Pipe, b"<|"),
        (SpecialName, b"<|N"),
        (SpecialEnd, b"<|N|"),
    ];
    cases.extend((1..7u8).map(|n| (CdataOpen(n), &b"<![CDATA["[..2 + usize::from(n)])));
    for (cand, held) in cases {
        for b in 0..=255u8 {
            let mut sc = Scanner {
                state: ScanState::Marker(cand),
                held: held.to_vec(),
                held_start: 0,
                offset: 0,
                limits: ScanLimits::default(),
            };
            let mut sink = Collect::default();
            let read = sc.advance(cand, &[b], 0, &mut sink);
            let (want_state, want_read, want_held) = match step(cand, b) {
                Step::Next(next) => (ScanState::Marker(next), 1, held.len() + 1),
                Step::Done(_) => (ScanState::Text, 1, 0),
                Step::Fail => (ScanState::Text, 0, 0),
            };
            assert_eq!((sc.state, read, sc.held.len()), (want_state, want_read, want_held), "{cand:?} then {b:#04x}");
        }
    }
}

/// Every delimiter split at every position (STYLE §4), drawn:
/// `<|/x>`, `</|x>`, `</x|>`, `-|->`, `--|>`, `]|]>`, `]]|>`, `<|||>`.
#[test]
fn every_delimiter_split() {
    let cases: &[&[u8]] = &[b"</x>", b"<x/>", b"<!--c-->", b"<![CDATA[c]]>", b"<|[N]|>", b"<x a='1' b=\"2\" c=3 d>"];
    for case in cases {
        check_splits(case);
    }
}

mod props {
    use super::*;
    use proptest::prelude::*;

    fn fragment() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            Just(b"<".to_vec()),
            Just(b">".to_vec()),
            Just(b"</".to_vec()),
            Just(b"<!--".to_vec()),
            Just(b"-->".to_vec()),
            Just(b"<![CDATA[".to_vec()),
            Just(b"]]>".to_vec()),
            Just(b"<|[".to_vec()),
            Just(b"]|>".to_vec()),
            Just(b"content".to_vec()),
            Just(b" a=\"".to_vec()),
            Just(b"\"".to_vec()),
            Just(b"/".to_vec()),
            Just(b"/>".to_vec()),
            Just(b"b".to_vec()),
            Just("中文".as_bytes().to_vec()),
            proptest::collection::vec(any::<u8>(), 0..6),
        ]
    }

    proptest! {
        /// Any split gives the same tokens, and spans tile the input.
        #[test]
        fn split_invariance(parts in proptest::collection::vec(fragment(), 0..24), cuts in proptest::collection::vec(any::<proptest::sample::Index>(), 0..8)) {
            split_invariant(&parts, &cuts, ScanLimits::default())?;
        }

        /// The same with limits small enough that names and quoted values
        /// (read as runs) meet them.
        #[test]
        fn split_invariance_at_small_limits(parts in proptest::collection::vec(fragment(), 0..24), cuts in proptest::collection::vec(any::<proptest::sample::Index>(), 0..8)) {
            split_invariant(&parts, &cuts, ScanLimits { max_marker_len: 12, max_comment_len: 24 })?;
        }
    }

    proptest! {
        /// `repeats` counts what a byte-by-byte walk of whole units counts
        /// (and `run_of` what a walk of one byte counts),
        /// at every length and with the first difference anywhere.
        #[test]
        fn repeats_is_the_walk(
            unit in prop_oneof![Just(*b"<<<<"), Just(*b"&lt;"), any::<[u8; 4]>()],
            whole in 0usize..40,
            tail in proptest::collection::vec(any::<u8>(), 0..20),
        ) {
            let mut hay: Vec<u8> = unit.repeat(whole);
            hay.extend_from_slice(&tail);
            let walked = hay.chunks_exact(4).take_while(|c| *c == unit).count() * 4;
            prop_assert_eq!(repeats(unit, &hay), walked);
            let first = hay.iter().take_while(|&&b| b == unit[0]).count();
            prop_assert_eq!(run_of(unit[0], &hay), first);
        }
    }

    fn split_invariant(
        parts: &[Vec<u8>],
        cuts: &[proptest::sample::Index],
        limits: ScanLimits,
    ) -> Result<(), TestCaseError> {
        {
            let input: Vec<u8> = parts.concat();
            let whole = scan_chunks(&[&input], limits);
            let mut points: Vec<usize> = cuts.iter().map(|c| c.index(input.len() + 1)).collect();
            points.sort_unstable();
            let mut chunks = Vec::new();
            let mut last = 0;
            for p in points {
                chunks.push(&input[last..p]);
                last = p;
            }
            chunks.push(&input[last..]);
            let split = scan_chunks(&chunks, limits);
            prop_assert_eq!(&split.toks, &whole.toks);
            let mut covered = 0;
            for sp in &whole.spans {
                prop_assert_eq!(sp.start, covered);
                covered = sp.end;
            }
            prop_assert_eq!(covered, input.len());
        }
        Ok(())
    }
}

proptest::proptest! {
    /// `find_str` finds what `str::find` finds, on text of few letters (so
    /// that near matches are common) and multi-byte delimiters.
    #[test]
    fn find_str_is_str_find(hay in "[a«»「始末」<>]{0,40}", needle in "[a«»「始末」<>]{0,4}") {
        proptest::prop_assert_eq!(find_str(&hay, &needle), hay.find(needle.as_str()));
    }
}

/// A limit of `usize::MAX` means "no limit": no overflow in the sizes the
/// scanner derives from it (a debug build would panic on one).
#[test]
fn the_largest_limits_mean_no_limit() {
    let limits = ScanLimits { max_marker_len: usize::MAX, max_comment_len: usize::MAX };
    let mut scanner = Scanner::new(limits);
    let mut sink = Collect::default();
    for chunk in b"<content a=\"1\">x<!-- c --></content><|[M]|>".chunks(3) {
        scanner.feed(chunk, &mut sink);
    }
    scanner.finish(&mut sink);
    let toks = sink.done().toks;
    assert_eq!(toks.len(), 5, "{toks:?}");
    assert_eq!(toks[4], Tok::Special("M".into()));
}

/// A span read back from JSON never ends before it starts; one made by
/// hand that does is empty, not an overflow.
#[test]
fn reversed_spans_are_refused_or_empty() {
    assert!(serde_json::from_str::<Span>("[5, 2]").is_err());
    assert_eq!(serde_json::from_str::<Span>("[2, 5]").ok(), Some(Span::new(2, 5)));
    assert_eq!(Span::new(5, 2).len(), 0);
    assert!(Span::new(5, 2).is_empty());
    let text = "0123456789";
    assert_eq!(&text[std::ops::Range::from(Span::new(2, 5))], "234");
}
