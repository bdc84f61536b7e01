//! Tests of the varied teacher (`teacher.rs`).

use super::*;

#[test]
fn keyword_queries_drop_function_words_and_punctuation() {
    assert_eq!(
        keywords("what are the structural problems of high speed flight ."),
        "structural problems high speed flight"
    );
    assert_eq!(keywords("what is ."), "what is .");
}

fn strategy(interleave: bool, reorder: Reorder, submit: usize) -> Strategy {
    Strategy {
        searches: vec![("bm25_search".into(), 3), ("vector_search".into(), 2)],
        one_message: true,
        order: Order::of(false, interleave),
        reorder,
        submit,
        top: false,
    }
}

#[test]
fn ranks_number_every_search_in_order() {
    let lens = [3, 2];
    assert_eq!(
        strategy(false, Reorder::None, 10).ranks(&lens),
        vec![1, 2, 3, 4, 5]
    );
    assert_eq!(strategy(false, Reorder::None, 2).ranks(&lens), vec![1, 2]);
    assert_eq!(
        strategy(true, Reorder::None, 10).ranks(&lens),
        vec![1, 4, 2, 5, 3]
    );
    assert_eq!(
        strategy(true, Reorder::Reversed, 3).ranks(&lens),
        vec![3, 5, 2]
    );
    let mut shuffled = strategy(false, Reorder::Shuffled(9), 10).ranks(&lens);
    assert_ne!(shuffled, vec![1, 2, 3, 4, 5]);
    shuffled.sort();
    assert_eq!(shuffled, vec![1, 2, 3, 4, 5]);
    // A search that returned fewer hits shifts the numbering.
    assert_eq!(
        strategy(true, Reorder::None, 10).ranks(&[1, 2]),
        vec![1, 2, 3]
    );
    // Fused: each id at the rank of its first appearance, in RRF order: c (in both), a, then
    // b and d tied, in order of appearance.
    let lists = [
        vec!["a".to_string(), "b".into(), "c".into()],
        vec!["c".to_string(), "d".into()],
    ];
    let fused = Strategy {
        order: Order::Rrf,
        ..strategy(false, Reorder::None, 10)
    };
    assert_eq!(fused.ranks_of(&lists), vec![3, 1, 2, 5]);
    let fused_reversed = Strategy {
        order: Order::Rrf,
        ..strategy(false, Reorder::Reversed, 2)
    };
    assert_eq!(fused_reversed.ranks_of(&lists), vec![5, 2]);
    assert_eq!(
        strategy(true, Reorder::None, 10).ranks_of(&lists),
        vec![1, 4, 2, 5, 3]
    );
}

/// Share of sampled strategies with `pick`, over 4000 seeds.
fn share(spec: &TeacherSpec, pick: impl Fn(&Strategy) -> bool) -> f64 {
    (0..4000u64)
        .filter(|&s| pick(&Strategy::sample(spec, s)))
        .count() as f64
        / 4000.0
}

#[test]
fn every_knob_moves_the_strategy_distribution() {
    let spec = TeacherSpec::default();
    // Tools uniform, searches uniform in 1..=2, k and submit uniform in 1..=10.
    let bm25_first = share(&spec, |s| s.searches[0].0 == "bm25_search");
    assert!((bm25_first - 0.5).abs() < 0.04, "{bm25_first}");
    assert!((share(&spec, |s| s.searches.len() == 2) - 0.5).abs() < 0.04);
    assert!((share(&spec, |s| s.searches[0].1 == 10) - 0.1).abs() < 0.03);
    assert!((share(&spec, |s| s.submit == 10) - 0.1).abs() < 0.03);
    assert!((share(&spec, |s| s.one_message) - 0.5).abs() < 0.04);
    let three = TeacherSpec {
        max_searches: 3,
        ..spec.clone()
    };
    assert!((share(&three, |s| s.searches.len() == 3) - 1.0 / 3.0).abs() < 0.04);
    let small_k = TeacherSpec {
        max_k: 3,
        final_k: 4,
        ..spec.clone()
    };
    assert!(share(&small_k, |s| s.searches.iter().all(|(_, k)| *k <= 3)) == 1.0);
    assert!(share(&small_k, |s| s.submit <= 4) == 1.0);
    let one_tool = TeacherSpec {
        tools: vec!["vector_search".into()],
        ..spec.clone()
    };
    assert_eq!(
        share(&one_tool, |s| s.searches[0].0 == "vector_search"),
        1.0
    );
    let separate = TeacherSpec {
        p_one_message: 0.0,
        ..spec.clone()
    };
    assert_eq!(share(&separate, |s| s.one_message), 0.0);
    let interleaved = |s: &Strategy| s.order == Order::RoundRobin && s.reorder == Reorder::None;
    let always = TeacherSpec {
        p_interleave: 1.0,
        p_reorder: 0.0,
        ..spec.clone()
    };
    // Interleaving needs two searches (half of the episodes).
    assert!((share(&always, interleaved) - 0.5).abs() < 0.04);
    let never = TeacherSpec {
        p_interleave: 0.0,
        ..spec.clone()
    };
    assert_eq!(share(&never, interleaved), 0.0);
    let reordered = |s: &Strategy| s.reorder != Reorder::None;
    assert!((share(&spec, reordered) - 0.2).abs() < 0.03);
    let no_reorder = TeacherSpec {
        p_reorder: 0.0,
        ..spec.clone()
    };
    assert_eq!(share(&no_reorder, reordered), 0.0);
    // `p_top` needs submit_hits, skips reordered lists and leaves every other draw alone.
    assert_eq!(share(&spec, |s| s.top), 0.0);
    let hits = TeacherSpec {
        submit_hits: true,
        ..spec.clone()
    };
    let tops = TeacherSpec {
        p_top: 1.0,
        ..hits.clone()
    };
    assert!((share(&tops, |s| s.top) - 0.8).abs() < 0.03);
    assert_eq!(share(&tops, |s| s.top && s.reorder != Reorder::None), 0.0);
    let no_top = TeacherSpec {
        p_top: 1.0,
        ..spec.clone()
    };
    assert_eq!(share(&no_top, |s| s.top), 0.0);
    for seed in 0..50u64 {
        let (a, b) = (Strategy::sample(&hits, seed), Strategy::sample(&tops, seed));
        assert_eq!(Strategy { top: false, ..b }, a);
    }
    // `p_rrf` fuses only merged lists (two searches: half), replaces round-robin there and
    // leaves every other draw alone.
    let fused = TeacherSpec {
        p_rrf: 0.5,
        ..tops.clone()
    };
    let rrf = |s: &Strategy| s.order == Order::Rrf;
    assert!((share(&fused, rrf) - 0.25).abs() < 0.03);
    assert_eq!(share(&fused, |s| rrf(s) && s.searches.len() < 2), 0.0);
    for seed in 0..200u64 {
        let (a, b) = (
            Strategy::sample(&tops, seed),
            Strategy::sample(&fused, seed),
        );
        let order = if b.order == Order::Rrf {
            a.order
        } else {
            b.order
        };
        assert_eq!(Strategy { order, ..b }, a);
    }
    // Deterministic per seed, different across seeds.
    assert_eq!(Strategy::sample(&spec, 5), Strategy::sample(&spec, 5));
    assert!((0..50u64).any(|s| Strategy::sample(&spec, s) != Strategy::sample(&spec, s + 50)));
}
