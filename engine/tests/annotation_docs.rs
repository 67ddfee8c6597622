//! One annotation table in the docs, held to the engine's list.

use trainwire_contract::annotations::KNOWN;

/// The annotation names of the table under `## Annotation reference` in
/// docs/annotations.md, in order.
fn documented() -> Vec<String> {
    let path = trainwire_test_support::repo_root().join("docs/annotations.md");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{e}"));
    let section = text
        .split("\n## ")
        .find(|s| s.starts_with("Annotation reference"))
        .expect("docs/annotations.md has an Annotation reference section");
    section
        .lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split('`').next())
        .filter(|name| name.starts_with("trainwire.dev/"))
        .map(str::to_string)
        .collect()
}

#[test]
fn the_table_names_every_annotation_a_user_may_set_once_in_the_engines_order() {
    assert_eq!(documented(), KNOWN);
}

#[test]
fn the_readme_points_to_the_table_instead_of_copying_it() {
    let readme = std::fs::read_to_string(trainwire_test_support::repo_root().join("README.md"))
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(
        !readme.lines().any(|l| l.starts_with("| `trainwire.dev/")),
        "README.md copies annotation rows: keep them in docs/annotations.md"
    );
    assert!(readme.contains("docs/annotations.md#annotation-reference"));
}
