use super::*;

fn matcher(stops: &[&str]) -> StopMatcher {
    StopMatcher::new(&stops.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>())
}

fn cont(emit: &str) -> StopOutcome {
    StopOutcome::Continue { emit: emit.to_owned() }
}

fn stopped(emit: &str) -> StopOutcome {
    StopOutcome::Stopped { emit: emit.to_owned() }
}

/// Feeds `deltas` and returns the outcomes.
fn run(stops: &[&str], deltas: &[&str]) -> Vec<StopOutcome> {
    let mut m = matcher(stops);
    deltas.iter().map(|d| m.push(d)).collect()
}

/// What a client should receive for the whole `text`: everything before the earliest stop
/// string, or all of it.
fn reference(stops: &[&str], text: &str) -> (String, bool) {
    match stops.iter().filter(|s| !s.is_empty()).filter_map(|s| text.find(s)).min() {
        Some(at) => (text[..at].to_owned(), true),
        None => (text.to_owned(), false),
    }
}

#[test]
fn without_stop_strings_everything_is_emitted_at_once() {
    let mut m = matcher(&[]);
    assert_eq!(m.push("Hello <"), cont("Hello <"));
    assert_eq!(m.push(""), cont(""));
    assert_eq!(m.flush(), "");
    // Empty stop strings are ignored.
    assert_eq!(run(&[""], &["abc"]), [cont("abc")]);
}

#[test]
fn stop_split_across_many_deltas() {
    let outcomes = run(&["</end>"], &["Hello <", "/e", "n", "d> tail", "more"]);
    assert_eq!(outcomes, [cont("Hello "), cont(""), cont(""), stopped(""), stopped("")]);
    let outcomes = run(&["</end>"], &["ab</e", "nd>xyz"]);
    assert_eq!(outcomes, [cont("ab"), stopped("")]);
    let outcomes = run(&["STOP"], &["a", "S", "T", "O", "Pz"]);
    assert_eq!(outcomes, [cont("a"), cont(""), cont(""), cont(""), stopped("")]);
}

#[test]
fn text_before_a_stop_in_the_same_delta_is_emitted() {
    assert_eq!(run(&["\n\n"], &["one\n", "two\n\nthree"]), [cont("one"), stopped("\ntwo")]);
}

#[test]
fn earliest_match_among_stop_strings_wins() {
    assert_eq!(run(&["world", "lo"], &["hello world"]), [stopped("hel")]);
    assert_eq!(run(&["abc", "bcd"], &["xabcd"]), [stopped("x")]);
    assert_eq!(run(&["bcd", "abce"], &["abcd"]), [stopped("a")]);
    // A complete later stop beats an incomplete earlier one.
    assert_eq!(run(&["abcd", "c"], &["ab", "c"]), [cont(""), stopped("ab")]);
}

#[test]
fn overlapping_prefixes_of_one_stop() {
    // "aaab": the hold-back must keep the longest possible start ("aa"), not restart.
    assert_eq!(run(&["aab"], &["a", "a", "a", "b"]), [cont(""), cont(""), cont("a"), stopped("")]);
    assert_eq!(run(&["abab"], &["ab", "a", "c"]), [cont(""), cont(""), cont("abac")]);
    assert_eq!(run(&["abab"], &["aba", "abab"]), [cont(""), stopped("aba")]);
}

#[test]
fn prefix_that_is_not_a_stop_is_held_then_released() {
    assert_eq!(run(&["STOP"], &["go ST", "ay", "!"]), [cont("go "), cont("STay"), cont("!")]);
    assert_eq!(run(&["STOP"], &["S", "T", "O", "X"]), [cont(""), cont(""), cont(""), cont("STOX")]);
    // Released in part: "ST" stops being a start, but the new "S" might be one.
    assert_eq!(run(&["STOP"], &["ST", "S"]), [cont(""), cont("ST")]);
}

#[test]
fn held_text_is_flushed_at_the_end() {
    let mut m = matcher(&["###"]);
    assert_eq!(m.push("abc#"), cont("abc"));
    assert_eq!(m.push("#"), cont(""));
    assert_eq!(m.flush(), "##");
    assert_eq!(m.flush(), "");
}

#[test]
fn nothing_is_flushed_after_a_stop() {
    let mut m = matcher(&["x"]);
    assert_eq!(m.push("abx"), stopped("ab"));
    assert_eq!(m.push("more"), stopped(""));
    assert_eq!(m.flush(), "");
}

#[test]
fn multibyte_characters() {
    assert_eq!(
        run(&["終わり"], &["こんにちは終", "わ", "り残り"]),
        [cont("こんにちは"), cont(""), stopped("")]
    );
    assert_eq!(run(&["é!"], &["café", "!"]), [cont("caf"), stopped("")]);
    // "è" shares its first UTF-8 byte with "é" but is no start of "éa".
    assert_eq!(run(&["éa"], &["è"]), [cont("è")]);
    // The suffix window starts inside a character: no slicing panic, nothing held.
    assert_eq!(run(&["abcdef"], &["ééé"]), [cont("ééé")]);
    assert_eq!(run(&["🦀🦀"], &["a🦀", "b🦀", "🦀c"]), [cont("a"), cont("🦀b"), stopped("")]);
}

#[test]
fn empty_deltas_change_nothing() {
    assert_eq!(
        run(&["end"], &["", "e", "", "n", "", "d", ""]),
        [cont(""), cont(""), cont(""), cont(""), cont(""), stopped(""), stopped("")]
    );
    let mut m = matcher(&["end"]);
    assert_eq!(m.push("x"), cont("x"));
    assert_eq!(m.push(""), cont(""));
    assert_eq!(m.flush(), "");
}

#[test]
fn stop_at_the_very_start() {
    assert_eq!(run(&["<|im_end|>"], &["<|im_end|>more"]), [stopped("")]);
    assert_eq!(run(&["<|im_end|>"], &["<|im_", "end|>"]), [cont(""), stopped("")]);
}

/// Every way of cutting each text into deltas gives the same output as matching the whole text,
/// and what was sent so far is always a prefix of that output (nothing is ever taken back).
#[test]
fn every_split_agrees_with_whole_text_matching() {
    let cases: [(&[&str], &str); 6] = [
        (&["ab"], "xaababy"),
        (&["aab", "b"], "aaaab"),
        (&["abab", "bac"], "abababac"),
        (&["終わ", "わり"], "お終終わり"),
        (&["STOP"], "STSTOSTOPx"),
        (&["zz"], "no stop here"),
    ];
    for (stops, text) in cases {
        let (expected, expect_stop) = reference(stops, text);
        let chars: Vec<(usize, char)> = text.char_indices().collect();
        let cuts = chars.len() - 1;
        for mask in 0u32..(1 << cuts) {
            let mut bounds = vec![0];
            bounds.extend((0..cuts).filter(|b| mask & (1 << b) != 0).map(|b| chars[b + 1].0));
            bounds.push(text.len());
            let mut m = StopMatcher::new(&stops.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>());
            let mut sent = String::new();
            let mut did_stop = false;
            for w in bounds.windows(2) {
                match m.push(&text[w[0]..w[1]]) {
                    StopOutcome::Continue { emit } => sent.push_str(&emit),
                    StopOutcome::Stopped { emit } => {
                        sent.push_str(&emit);
                        did_stop = true;
                        break;
                    }
                }
                assert!(expected.starts_with(&sent), "{text:?} split {bounds:?}: sent {sent:?}");
                // Only what could still begin a stop string is held back.
                assert!(m.held.len() < stops.iter().map(|s| s.len()).max().unwrap_or(1));
            }
            if !did_stop {
                sent.push_str(&m.flush());
            }
            assert_eq!((sent.as_str(), did_stop), (expected.as_str(), expect_stop), "{text:?} {bounds:?}");
        }
    }
}
