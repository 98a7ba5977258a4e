//! DESIGN.md's layer table, held against the code: each module of the library reaches only
//! itself and the modules its row names, each of them higher in the table, and every module
//! has a row. The table is read from DESIGN.md and the paths from the sources, so a `use`
//! line that crosses the table upward, or a row that stops saying the truth, fails here.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The layer table: each module, in the table's order, with the modules its row names.
fn table(design: &str) -> Vec<(String, BTreeSet<String>)> {
    let names = |cell: &str| -> BTreeSet<String> {
        cell.split(',')
            .map(|name| name.trim().trim_matches('`').to_string())
            .filter(|name| !name.is_empty())
            .collect()
    };
    design
        .lines()
        .skip_while(|line| !line.starts_with("| module | owns | uses |"))
        .skip(2) // the header and its rule
        .take_while(|line| line.starts_with('|'))
        .map(|line| {
            let cells: Vec<&str> = line.trim_matches('|').split('|').collect();
            let module = cells[0].trim().trim_matches('`').to_string();
            (module, names(cells.last().unwrap_or(&"")))
        })
        .collect()
}

/// The first segment of every `crate::` path in `code`, `crate::{a::b, c}` giving `a` and `c`;
/// comment lines (doc comments too) are skipped.
fn crate_paths(code: &str) -> BTreeSet<String> {
    let code: String = code
        .lines()
        .filter(|line| !line.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n");
    let mut found = BTreeSet::new();
    let mut rest = code.as_str();
    while let Some(at) = rest.find("crate::") {
        // `crate::` inside a longer name (`ferropool_crate::`) is not one.
        let inside = rest[..at]
            .chars()
            .next_back()
            .is_some_and(|c| c.is_alphanumeric() || c == '_');
        rest = &rest[at + "crate::".len()..];
        if inside {
            continue;
        }
        if let Some(group) = rest.strip_prefix('{') {
            // The group's top-level items, up to its closing brace.
            let (mut depth, mut item, mut end) = (0usize, String::new(), group.len());
            for (i, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => {
                        end = i;
                        break;
                    }
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        found.insert(first_segment(&item));
                        item.clear();
                        continue;
                    }
                    _ => {}
                }
                item.push(c);
            }
            if !item.trim().is_empty() {
                found.insert(first_segment(&item));
            }
            rest = &group[end..];
        } else {
            found.insert(first_segment(rest));
        }
    }
    found.remove("");
    found
}

/// The first path segment of `path`.
fn first_segment(path: &str) -> String {
    path.trim_start()
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect()
}

/// Every `.rs` file under `dir`.
fn sources(dir: &Path, into: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("a source folder") {
        let path = entry.expect("a source entry").path();
        if path.is_dir() {
            sources(&path, into);
        } else if path.extension().is_some_and(|e| e == "rs") {
            into.push(path);
        }
    }
}

#[test]
fn every_module_reaches_only_the_modules_its_row_names() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let design = std::fs::read_to_string(root.join("DESIGN.md")).expect("DESIGN.md");
    let rows = table(&design);
    assert!(rows.len() > 10, "the layer table is read: {rows:?}");
    let order: BTreeMap<&str, usize> = rows
        .iter()
        .enumerate()
        .map(|(i, (module, _))| (module.as_str(), i))
        .collect();
    let mut wrong = Vec::new();
    for (i, (module, uses)) in rows.iter().enumerate() {
        for used in uses {
            if order.get(used.as_str()).is_none_or(|&at| at >= i) {
                wrong.push(format!(
                    "the row of `{module}` names `{used}`, not above it"
                ));
            }
        }
    }
    let src = root.join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    for file in files {
        let relative = file.strip_prefix(&src).expect("under src");
        let mut parts = relative.iter().map(|p| p.to_string_lossy().into_owned());
        let first = parts.next().expect("a file name");
        let module = first.trim_end_matches(".rs").to_string();
        if module == "lib" {
            continue; // the table of contents: it declares every module
        }
        let Some(&row) = order.get(module.as_str()) else {
            wrong.push(format!(
                "{}: module `{module}` has no row",
                relative.display()
            ));
            continue;
        };
        let allowed = &rows[row].1;
        let code = std::fs::read_to_string(&file).expect("a source file");
        for used in crate_paths(&code) {
            if used != module && !allowed.contains(&used) {
                wrong.push(format!(
                    "{}: `crate::{used}` is not in the row of `{module}`",
                    relative.display()
                ));
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// The reader finds what it must, so that the check above cannot pass by reading nothing.
#[test]
fn the_reader_finds_plain_grouped_and_nested_paths() {
    let code = "use crate::sync::Arc;\n\
                // use crate::commented::Out;\n\
                /// [`x`](crate::doc::Link)\n\
                use crate::{\n    pool::{BufferPool, PoolConfig},\n    tensor::Tensor,\n};\n\
                fn f() { crate::group::g(); other_crate::x(); }\n";
    let found: Vec<String> = crate_paths(code).into_iter().collect();
    assert_eq!(found, ["group", "pool", "sync", "tensor"]);
    let rows = table("| module | owns | uses |\n|---|---|---|\n| `a` | x | |\n| `b` | y | `a`, `sync` |\n\nafter");
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[1].0, "b");
    assert_eq!(
        rows[1].1,
        BTreeSet::from(["a".to_string(), "sync".to_string()])
    );
}
