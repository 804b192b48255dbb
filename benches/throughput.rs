//! Throughput of the parser, measured as ratios inside one run (the machines
//! are shared and noisy; absolute numbers drift, ratios hold):
//!
//! * `corpus/whole` vs `corpus/chunk4`: every transcript of `corpora/`, fed
//!   whole and 4 bytes at a time (SSE deltas are often this small);
//! * `scaling/1KiB` .. `scaling/64MiB`: time per byte must stay flat
//!   (linear time); criterion reports throughput, compare the MiB/s;
//! * `naive/*`: what applications do today, re-running a tag regex over the
//!   whole accumulated text on every delta, vs spindle on the same deltas;
//! * `corpus/memchr`: a plain byte scan of the same bytes (the limit);
//! * `prose/*`: the same three on the prose-heavy transcripts of the corpus
//!   alone (`long-rp-*`: long role-play responses, mostly narration with a
//!   thought, a status bar and variable updates), the shape of most real
//!   output; most of `corpus/` is short protocol cases (calls, repairs,
//!   payload edge cases), an element every few dozen bytes;
//! * `dense/*`: markup-dense output (an element every ~64 bytes: status
//!   bars, choices, variable updates between short content), whole and at
//!   4 bytes; divide the time by the element count for the cost per element;
//!   `whole_batched` the whole input through `Parser::feed_with`, its
//!   events taken a batch at a time (as the CLI reads a file and a
//!   streaming consumer takes them) instead of all held until the end;
//!   `*_on_demand` the same with the structured payloads left for later
//!   (`Payloads::OnDemand`), the parse without building them;
//! * `dense160/*`: the same elements with a paragraph of narration for
//!   content (an element every ~160 bytes, the shape the issue names),
//!   whole and at 4 bytes, in bytes per second;
//! * `kinds/*`: the cost per element by kind: pairs of one element of a kind
//!   and a short content (so that neither merges with its neighbour), whole;
//!   criterion reports elements per second;
//! * `hostile/*`: 1 MiB of `<`, an endless attribute, an endless comment,
//!   `<b>` repeated, next to 1 MiB of prose: within 2x of prose;
//! * `delta/*`: the cost per delta, markup-free prose fed 4 bytes at a time
//!   into one content element (the HTML filter on every delta) and into one
//!   thought (no filter); criterion reports deltas per second.
//!
//! Run: `cargo bench --bench throughput` (add `-- --quick` for a fast pass).
//!
//! The benchmark runs on the binary's allocator (the default `mimalloc`
//! feature), so that its figures are the release binary's. The system
//! allocator (`--no-default-features`) maps every buffer of a few MiB afresh
//! and pays its page faults on each parse: the hostile inputs, whose output
//! is several MiB, then measure the kernel more than the parser.

/// The binary's allocator (the default `mimalloc` feature).
#[cfg(feature = "mimalloc")]
#[global_allocator]
static GLOBAL: alloc::Allocator = alloc::Allocator;

#[cfg(feature = "mimalloc")]
#[path = "../src/bin/spindle/alloc.rs"]
mod alloc;

mod common;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use spindle::payload::Payloads;
use spindle::{Parser, ParserOptions, Registry};
use std::hint::black_box;
use std::sync::Arc;

/// Every transcript of `corpora/`, with the registry its name asks for.
fn corpus() -> Vec<(Arc<Registry>, Vec<u8>)> {
    corpus_matching(|_| true)
}

/// The transcripts of `corpora/` whose file name `keep` accepts.
fn corpus_matching(keep: impl Fn(&str) -> bool) -> Vec<(Arc<Registry>, Vec<u8>)> {
    common::transcripts()
        .into_iter()
        .filter_map(|p| {
            let name = p.file_name()?.to_str()?.to_string();
            if !keep(&name) {
                return None;
            }
            let profile = Registry::profile_for_file_name(&name).unwrap_or("filament");
            Some((Arc::new(Registry::profile(profile)?), std::fs::read(&p).ok()?))
        })
        .collect()
}

fn parse(registry: &Arc<Registry>, input: &[u8], chunk: usize) -> usize {
    parse_with(registry, input, chunk, ParserOptions::default())
}

fn parse_with(registry: &Arc<Registry>, input: &[u8], chunk: usize, options: ParserOptions) -> usize {
    let mut parser = Parser::with_options(registry.clone(), options);
    let mut events = Vec::new();
    let mut n = 0;
    for c in input.chunks(chunk) {
        parser.feed_into(c, &mut events);
        n += events.len();
        events.clear();
    }
    n + parser.finish().len()
}

/// Parses `input` whole through [`Parser::feed_with`], the events handed
/// over (and dropped) a batch at a time as a consumer that streams them
/// would: what the CLI does with a file, the working set a batch's events.
fn parse_batched(registry: &Arc<Registry>, input: &[u8], options: ParserOptions) -> usize {
    let mut parser = Parser::with_options(registry.clone(), options);
    let mut n = 0;
    let Ok(()) = parser.feed_with(input, |events| {
        n += events.len();
        Ok::<(), std::convert::Infallible>(())
    });
    n + parser.finish().len()
}

fn bench_corpus(c: &mut Criterion) {
    bench_transcripts(c, "corpus", &corpus());
}

/// The prose-heavy transcripts of the corpus (`long-rp-*`).
fn bench_prose(c: &mut Criterion) {
    let files = corpus_matching(|name| name.starts_with("long-rp-"));
    assert!(!files.is_empty(), "no long-rp-* transcript in corpora/");
    bench_transcripts(c, "prose", &files);
}

/// One group over `files`: each parsed whole and at 4 bytes, and a plain
/// `memchr` scan of the same bytes (the limit).
fn bench_transcripts(c: &mut Criterion, group: &str, files: &[(Arc<Registry>, Vec<u8>)]) {
    let total: usize = files.iter().map(|(_, b)| b.len()).sum();
    let mut g = c.benchmark_group(group);
    g.throughput(Throughput::Bytes(total as u64));
    g.bench_function("whole", |b| {
        b.iter(|| files.iter().map(|(r, input)| parse(r, black_box(input), input.len().max(1))).sum::<usize>())
    });
    g.bench_function("chunk4", |b| {
        b.iter(|| files.iter().map(|(r, input)| parse(r, black_box(input), 4)).sum::<usize>())
    });
    g.bench_function("memchr", |b| {
        b.iter(|| files.iter().map(|(_, input)| memchr::memchr_iter(b'<', black_box(input)).count()).sum::<usize>())
    });
    g.finish();
}

/// The elements of markup-dense output, in the order they repeat.
const DENSE: [&str; 4] = [
    "<content>She nods and steps closer to the fire.</content>\n",
    "<status_bar><hp>41/60</hp><mood>calm</mood></status_bar>\n",
    "<variable_update>[[\"ADD\", \"player.fear\", -1]]</variable_update>\n",
    "<choice><option>Ask about the wolves</option><option>Rest</option></choice>\n",
];

/// `pieces` repeated in order to at least `size` bytes, and how many
/// elements that is (one per piece).
fn repeated(pieces: &[&str], size: usize) -> (Vec<u8>, usize) {
    let mut out = String::new();
    let mut n = 0;
    while out.len() < size {
        out.push_str(pieces[n % pieces.len()]);
        n += 1;
    }
    (out.into_bytes(), n)
}

/// Markup-dense output: an element every ~64 bytes (four short elements
/// in ~255 bytes, repeated).
fn dense(size: usize) -> (Vec<u8>, usize) {
    repeated(&DENSE, size)
}

/// The same four elements with a paragraph of narration for content: an
/// element every ~160 bytes, the shape the issue's target names (status
/// bars, choices and updates between short paragraphs).
const DENSE_160: [&str; 4] = [
    "<content>She nods and steps closer to the fire. The wind has dropped, and somewhere past the pines a branch \
     cracks under something heavy. \u{300c}They come down from the ridge when the snow is deep,\u{300d} she says, \
     not looking up. \u{300c}Keep the torch between you and the dark.\u{300d} You feed the fire another log; the \
     sparks climb, and for a moment the clearing is as bright as noon before the shadows settle back around you \
     both.</content>\n",
    DENSE[1],
    DENSE[2],
    DENSE[3],
];

fn bench_dense(c: &mut Criterion) {
    let registry = Arc::new(Registry::filament());
    let (input, elements) = dense(1 << 20);
    let mut g = c.benchmark_group("dense");
    g.throughput(Throughput::Elements(elements as u64));
    g.sample_size(10);
    g.bench_function("whole", |b| b.iter(|| parse(&registry, black_box(&input), input.len())));
    g.bench_function("chunk4", |b| b.iter(|| parse(&registry, black_box(&input), 4)));
    // Whole, the events taken a batch at a time (`Parser::feed_with`, as
    // the CLI reads a file) instead of all held until the end.
    g.bench_function("whole_batched", |b| {
        b.iter(|| parse_batched(&registry, black_box(&input), ParserOptions::default()))
    });
    // The structured payloads left for later (`Payloads::OnDemand`): what
    // the parse costs a caller that builds none of them.
    let on_demand = ParserOptions { payloads: Payloads::OnDemand, ..ParserOptions::default() };
    g.bench_function("whole_on_demand", |b| {
        b.iter(|| parse_with(&registry, black_box(&input), input.len(), on_demand))
    });
    g.bench_function("chunk4_on_demand", |b| b.iter(|| parse_with(&registry, black_box(&input), 4, on_demand)));
    g.finish();
}

/// `dense160/*`: the issue's markup-dense shape, an element every ~160
/// bytes; criterion reports bytes per second (the target is ≥150 MB/s
/// whole), the cost per element is the time over `elements` (printed).
fn bench_dense160(c: &mut Criterion) {
    let registry = Arc::new(Registry::filament());
    let (input, elements) = repeated(&DENSE_160, 1 << 20);
    eprintln!("dense160: {} bytes, {elements} elements, {} bytes each", input.len(), input.len() / elements);
    let mut g = c.benchmark_group("dense160");
    g.throughput(Throughput::Bytes(input.len() as u64));
    g.sample_size(10);
    g.bench_function("whole", |b| b.iter(|| parse(&registry, black_box(&input), input.len())));
    g.bench_function("chunk4", |b| b.iter(|| parse(&registry, black_box(&input), 4)));
    g.finish();
}

fn bench_kinds(c: &mut Criterion) {
    let registry = Arc::new(Registry::filament());
    let content = DENSE[0];
    let pairs = [
        ("thought", "<thought>She nods and steps closer to the fire.</thought>\n", content),
        ("status_bar", DENSE[1], content),
        ("variable_update", DENSE[2], content),
        ("choice", DENSE[3], content),
        // Content styled as role-play output is (a span with a safe
        // style, which the filter passes without its HTML rewriter), after
        // a plain thought.
        (
            "content_styled",
            "<thought>She nods.</thought>\n",
            "<content>She nods and <span style=\"color: #c00\">steps</span> closer.</content>\n",
        ),
        // The same with an attribute to remove: the rewriter is built.
        (
            "content_rewritten",
            "<thought>She nods.</thought>\n",
            "<content>She nods and <span title=\"t\" style=\"color: #c00\">steps</span> closer.</content>\n",
        ),
    ];
    let mut g = c.benchmark_group("kinds");
    g.sample_size(10);
    for (name, first, second) in pairs {
        let (input, elements) = repeated(&[first, second], 256 << 10);
        g.throughput(Throughput::Elements(elements as u64));
        g.bench_function(name, |b| b.iter(|| parse(&registry, black_box(&input), input.len())));
    }
    g.finish();
}

fn bench_hostile(c: &mut Criterion) {
    let registry = Arc::new(Registry::filament());
    let mib = 1 << 20;
    let prose = "The lamp turned slowly above the dark water, and the keeper counted the steps. ".repeat(mib / 80 + 1);
    let inputs: Vec<(&str, Vec<u8>)> = vec![
        ("prose", format!("<content>{prose}</content>").into_bytes()),
        ("lt_flood", vec![b'<'; mib]),
        ("endless_attribute", format!("<content x=\"{}", "a".repeat(mib)).into_bytes()),
        ("endless_comment", format!("<content><!--{}", "a".repeat(mib)).into_bytes()),
        ("b_repeated", "<b>".repeat(mib / 3).into_bytes()),
    ];
    let mut g = c.benchmark_group("hostile");
    g.sample_size(10);
    for (name, input) in &inputs {
        g.throughput(Throughput::Bytes(input.len() as u64));
        g.bench_with_input(BenchmarkId::from_parameter(name), input, |b, input| {
            b.iter(|| parse(&registry, black_box(input), 4096))
        });
    }
    g.finish();
}

fn bench_delta(c: &mut Criterion) {
    let registry = Arc::new(Registry::filament());
    // About 256 KiB: 65,000 deltas.
    let prose =
        "The lamp turned slowly above the dark water, and the keeper counted the steps. ".repeat((256 << 10) / 80);
    let mut g = c.benchmark_group("delta");
    g.sample_size(10);
    for tag in ["content", "thought"] {
        let input = format!("<{tag}>{prose}</{tag}>").into_bytes();
        // Counted per 4-byte chunk fed: one delta each (the few chunks
        // that hold part of a tag included).
        g.throughput(Throughput::Elements(input.len().div_ceil(4) as u64));
        g.bench_with_input(BenchmarkId::from_parameter(tag), &input, |b, input| {
            b.iter(|| parse(&registry, black_box(input), 4))
        });
    }
    g.finish();
}

/// One representative response (719 bytes): a thought, content with
/// inline HTML, a comment and `a < b` prose, a variable update and a status
/// bar. Every scaling input is this unit repeated, so the 1 KiB and the
/// 64 MiB inputs have the same mix and time per byte compares like with
/// like.
const UNIT: &str = "<thought>\nThe player asked about the forest. Midnight, so danger is higher; \
mention the wolves, suggest a torch, keep it short.\n</thought>\n<content>\n\u{3000}\u{3000}\u{300c}In this \
forest you must be <b>careful</b>,\u{300d} she whispers. <span style=\"color: #c00\">Something moves</span> \
between the trees; if a < b then the wolves are closer than 5 > 3 paces.<br>\n<!-- consider: the torch -->\n\
\u{3000}\u{3000}You raise the torch and the shadows draw back, for now.\n</content>\n<variable_update>\n\
<analysis>- danger rises at midnight</analysis>\n[[\"SET\", \"world.time\", \"00:10\"], \
[\"ADD\", \"player.fear\", 2], [\"PUSH\", \"player.log\", \"saw wolves\"]]\n</variable_update>\n\
<status_bar><mood>tense</mood><location>Dark Forest</location><hp>42/60</hp></status_bar>\n";

/// `UNIT` repeated to at least `size` bytes, cut after a whole unit.
fn stream_of(size: usize) -> Vec<u8> {
    let units = size.div_ceil(UNIT.len()).max(1);
    UNIT.repeat(units).into_bytes()
}

fn bench_scaling(c: &mut Criterion) {
    let registry = Arc::new(Registry::filament());
    let mut g = c.benchmark_group("scaling");
    for (label, size) in [("1KiB", 1 << 10), ("64KiB", 64 << 10), ("1MiB", 1 << 20), ("64MiB", 64 << 20)] {
        let input = stream_of(size);
        g.throughput(Throughput::Bytes(input.len() as u64));
        if size >= 1 << 20 {
            g.sample_size(10);
        }
        g.bench_with_input(BenchmarkId::from_parameter(label), &input, |b, input| {
            b.iter(|| parse(&registry, black_box(input), 64 * 1024))
        });
    }
    g.finish();
}

/// The baseline applications write today: on every delta, append it and run
/// a regex for complete `<tag>...</tag>` pairs over the whole text.
fn naive_reparse(input: &[u8], chunk: usize, re: &regex::Regex) -> usize {
    let mut text = String::new();
    let mut found = 0;
    for c in input.chunks(chunk) {
        text.push_str(&String::from_utf8_lossy(c));
        found = re.captures_iter(&text).count();
    }
    found
}

fn bench_naive(c: &mut Criterion) {
    let registry = Arc::new(Registry::filament());
    let re = regex::Regex::new(
        r"(?s)<(thought|content|variable_update|status_bar)>(.*?)</(thought|content|variable_update|status_bar)>",
    )
    .expect("valid regex");
    let mut g = c.benchmark_group("naive");
    g.sample_size(10);
    for size in [4 << 10, 16 << 10, 64 << 10] {
        let input = stream_of(size);
        g.throughput(Throughput::Bytes(input.len() as u64));
        g.bench_with_input(BenchmarkId::new("regex_reparse_chunk4", size), &input, |b, input| {
            b.iter(|| naive_reparse(black_box(input), 4, &re))
        });
        g.bench_with_input(BenchmarkId::new("spindle_chunk4", size), &input, |b, input| {
            b.iter(|| parse(&registry, black_box(input), 4))
        });
    }
    g.finish();
}

criterion_group!(
    benches,
    bench_corpus,
    bench_prose,
    bench_dense,
    bench_dense160,
    bench_kinds,
    bench_hostile,
    bench_delta,
    bench_scaling,
    bench_naive
);
criterion_main!(benches);
