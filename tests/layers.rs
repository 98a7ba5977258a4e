//! DESIGN.md's tables, held against the code. Every path of the library's code (comments,
//! strings and test modules aside), in every form (`crate::`, `super::`, `self::`, a child
//! module's name, grouped or not), is resolved to the file it names, and:
//!
//! - each top-level module reaches only itself and the modules its row of "## Layers" names,
//!   each of them higher in the table, and every module has a row;
//! - inside `src/pool`, each wing reaches only itself and the wings its row of "### The
//!   pool's wings" names, each of them higher in that table, and every wing has a row; a
//!   path that names an item through the pool's `mod.rs` (a public re-export) reaches the
//!   face (`mod.rs`) itself, so it counts as an upward import too;
//! - no files of `src/pool` or `src/arena` import each other in a circle (the top level
//!   cannot: its table orders the modules).
//!
//! The tables are read from DESIGN.md and the paths from the sources, so an import that
//! crosses a table upward, a circle put back, or a row that stops saying the truth fails
//! here.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// A table of DESIGN.md whose header row is `header`: each row's first cell, in the table's
/// order, with the names its last cell lists.
fn table(design: &str, header: &str) -> Vec<(String, BTreeSet<String>)> {
    let names = |cell: &str| -> BTreeSet<String> {
        cell.split(',')
            .map(|name| name.trim().trim_matches('`').to_string())
            .filter(|name| !name.is_empty())
            .collect()
    };
    design
        .lines()
        .skip_while(|line| !line.starts_with(header))
        .skip(2) // the header and its rule
        .take_while(|line| line.starts_with('|'))
        .map(|line| {
            let cells: Vec<&str> = line.trim_matches('|').split('|').collect();
            let name = cells[0].trim().trim_matches('`').to_string();
            (name, names(cells.last().unwrap_or(&"")))
        })
        .collect()
}

/// `code` with its comments removed and its string and character literals emptied; line
/// breaks are kept, so that lines keep their numbers and indentation.
fn strip(code: &str) -> String {
    let chars: Vec<char> = code.chars().collect();
    let mut out = String::with_capacity(code.len());
    let mut i = 0;
    let ident = |c: char| c.is_alphanumeric() || c == '_';
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            i += 2;
            while i < chars.len() && !(chars[i] == '*' && chars.get(i + 1) == Some(&'/')) {
                if chars[i] == '\n' {
                    out.push('\n');
                }
                i += 1;
            }
            i += 2;
        } else if c == 'r'
            && (next == Some('"') || next == Some('#'))
            && !(i > 0 && ident(chars[i - 1]))
        {
            // A raw string: r"..." or r#"..."#.
            let mut j = i + 1;
            let mut hashes = 0;
            while chars.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            if chars.get(j) != Some(&'"') {
                out.push(c);
                i += 1;
                continue;
            }
            j += 1;
            loop {
                match chars.get(j) {
                    None => break,
                    Some('"') if (0..hashes).all(|k| chars.get(j + 1 + k) == Some(&'#')) => {
                        j += 1 + hashes;
                        break;
                    }
                    Some('\n') => out.push('\n'),
                    _ => {}
                }
                j += 1;
            }
            out.push_str("\"\"");
            i = j;
        } else if c == '"' {
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                if chars[i] == '\n' {
                    out.push('\n');
                }
                i += if chars[i] == '\\' { 2 } else { 1 };
            }
            i += 1;
            out.push_str("\"\"");
        } else if c == '\'' {
            // A character literal ('x', '\n', '\u{..}'), or a lifetime ('a), kept as it is.
            let end = if next == Some('\\') {
                (i + 2..chars.len()).find(|&j| chars[j] == '\'')
            } else if chars.get(i + 2) == Some(&'\'') {
                Some(i + 2)
            } else {
                None
            };
            match end {
                Some(end) => {
                    out.push_str("' '");
                    i = end + 1;
                }
                None => {
                    out.push(c);
                    i += 1;
                }
            }
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

/// A path's segments and `{ ... }` groups, expanded: `a::{b, c::{d, e}}` gives `a::b`,
/// `a::c::d` and `a::c::e` (`self` inside a group names the group's own path). Returns the
/// paths and the index just past the tree.
fn path_tree(code: &[char], mut i: usize) -> (Vec<Vec<String>>, usize) {
    let skip_space = |i: &mut usize| {
        while code.get(*i).is_some_and(|c| c.is_whitespace()) {
            *i += 1;
        }
    };
    let mut segments = Vec::new();
    loop {
        skip_space(&mut i);
        let start = i;
        while code
            .get(i)
            .is_some_and(|&c| c.is_alphanumeric() || c == '_' || c == '*')
        {
            i += 1;
        }
        if i == start {
            break;
        }
        segments.push(code[start..i].iter().collect::<String>());
        skip_space(&mut i);
        if code.get(i) == Some(&':') && code.get(i + 1) == Some(&':') {
            i += 2;
            skip_space(&mut i);
            if code.get(i) == Some(&'{') {
                break;
            }
        } else {
            return (vec![segments], i);
        }
    }
    if code.get(i) != Some(&'{') {
        return (vec![segments], i);
    }
    i += 1;
    let mut paths = Vec::new();
    loop {
        skip_space(&mut i);
        match code.get(i) {
            None => break,
            Some('}') => {
                i += 1;
                break;
            }
            Some(',') => {
                i += 1;
                continue;
            }
            _ => {}
        }
        let (inner, end) = path_tree(code, i);
        if end == i {
            i += 1; // not a path (`as`, a stray character): step over it
            continue;
        }
        i = end;
        for tail in inner {
            let mut path = segments.clone();
            path.extend(tail.into_iter().filter(|s| s != "self"));
            paths.push(path);
        }
        // `x as y`: the alias names nothing new.
        skip_space(&mut i);
        if code[i..].starts_with(&['a', 's', ' ']) {
            i += 3;
            let (_, end) = path_tree(code, i);
            i = end;
        }
    }
    (paths, i)
}

/// One source file of the library.
struct Source {
    /// Its path under `src`.
    file: PathBuf,
    /// Its module path (`pool/engine/inner.rs`: `pool::engine::inner`).
    module: Vec<String>,
    /// The child modules it declares in files of their own, and whether each is compiled
    /// for tests only (its declaration carries a `cfg` naming `test`).
    children: Vec<(String, bool)>,
    /// Every path of its code outside test modules, resolved to absolute module paths
    /// (`crate` left out), with its line.
    paths: Vec<(usize, Vec<String>)>,
}

/// Whether the attribute lines above line `at` carry a `cfg` that names `test`.
fn test_only(lines: &[&str], at: usize) -> bool {
    lines[..at]
        .iter()
        .rev()
        .take_while(|line| line.trim_start().starts_with("#["))
        .any(|line| {
            line.contains("cfg(")
                && line
                    .split(|c: char| !(c.is_alphanumeric() || c == '_'))
                    .any(|word| word == "test")
        })
}

/// The declaration `mod name;` or `mod name {` on `line` (any visibility): the name, and
/// whether the module is inline.
fn mod_declaration(line: &str) -> Option<(String, bool)> {
    let mut rest = line.trim_start();
    if let Some(after) = rest.strip_prefix("pub") {
        rest = after.trim_start();
        if rest.starts_with('(') {
            rest = rest[rest.find(')')? + 1..].trim_start();
        }
    }
    let rest = rest.strip_prefix("mod ")?.trim_start();
    let name: String = rest
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect();
    let tail = rest[name.len()..].trim();
    match tail {
        ";" => Some((name, false)),
        "{" => Some((name, true)),
        _ => None,
    }
}

/// Reads one source file: its module, its children and its resolved paths.
fn read_source(src: &Path, file: &Path) -> Source {
    let relative = file.strip_prefix(src).expect("under src").to_path_buf();
    let mut module: Vec<String> = relative
        .iter()
        .map(|part| part.to_string_lossy().trim_end_matches(".rs").to_string())
        .collect();
    if matches!(module.last().map(String::as_str), Some("mod" | "lib")) {
        module.pop();
    }
    let code = strip(&std::fs::read_to_string(file).expect("a source file"));
    let lines: Vec<&str> = code.lines().collect();
    // Inline modules, by rustfmt's indentation: `mod x {` at some indentation closes at the
    // first line that is that indentation and `}`.
    let mut inline: Vec<(String, String, bool)> = Vec::new(); // (indent, name, test only)
    let mut where_: Vec<(Vec<String>, bool)> = Vec::new(); // per line: inline path, test only
    let mut children = Vec::new();
    let mut local = BTreeSet::new(); // modules declared here, files or inline
    for (at, line) in lines.iter().enumerate() {
        let test = inline.iter().any(|(_, _, test)| *test);
        where_.push((
            inline.iter().map(|(_, name, _)| name.clone()).collect(),
            test,
        ));
        match mod_declaration(line) {
            Some((name, true)) => {
                let indent: String = line.chars().take_while(|c| *c == ' ').collect();
                local.insert(name.clone());
                inline.push((indent, name, test_only(&lines, at)));
            }
            Some((name, false)) => {
                if inline.is_empty() {
                    children.push((name.clone(), test_only(&lines, at)));
                }
                local.insert(name);
            }
            None => {
                if inline
                    .last()
                    .is_some_and(|(indent, _, _)| *line == format!("{indent}}}"))
                {
                    inline.pop();
                }
            }
        }
    }
    let chars: Vec<char> = code.chars().collect();
    let line_of = {
        let mut starts = vec![0];
        starts.extend(
            chars
                .iter()
                .enumerate()
                .filter(|(_, c)| **c == '\n')
                .map(|(i, _)| i + 1),
        );
        move |i: usize| starts.partition_point(|&start| start <= i) - 1
    };
    let word_before = |i: usize| -> String {
        let end = (0..i)
            .rev()
            .find(|&j| !chars[j].is_whitespace())
            .map_or(0, |j| j + 1);
        let start = (0..end)
            .rev()
            .find(|&j| !(chars[j].is_alphanumeric() || chars[j] == '_'))
            .map_or(0, |j| j + 1);
        chars[start..end].iter().collect()
    };
    let is_ident = |c: char| c.is_alphanumeric() || c == '_';
    let mut paths = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let at_word =
            i == 0 || !(is_ident(chars[i - 1]) || chars[i - 1] == '$' || chars[i - 1] == ':');
        if !at_word || !is_ident(chars[i]) {
            i += 1;
            continue;
        }
        let end = (i..chars.len())
            .find(|&j| !is_ident(chars[j]))
            .unwrap_or(chars.len());
        let word: String = chars[i..end].iter().collect();
        let line = line_of(i);
        let (inside, test) = &where_[line];
        let after = chars[end..].iter().skip_while(|c| c.is_whitespace());
        let path_start = after.clone().take(2).collect::<String>() == "::";
        let before = word_before(i);
        // `pub(in crate::x)` restricts visibility; it imports nothing.
        let restriction = before == "in";
        // A path that starts with a module declared here is one only in a `use`.
        let starts_local = local.contains(&word) && before == "use";
        if *test
            || restriction
            || !path_start
            || !(matches!(word.as_str(), "crate" | "super" | "self") || starts_local)
        {
            i = end;
            continue;
        }
        // A `pub use` (a public re-export) is the crate's face, not an import.
        let statement_start = (0..i)
            .rev()
            .find(|&j| matches!(chars[j], ';' | '{' | '}' | ']'))
            .map_or(0, |j| j + 1);
        let statement: String = chars[statement_start..i].iter().collect();
        if statement.trim_start().starts_with("pub use") {
            i = end;
            continue;
        }
        let (trees, stop) = path_tree(&chars, i);
        let here: Vec<String> = module.iter().chain(inside).cloned().collect();
        for segments in trees {
            let mut resolved = here.clone();
            let mut rest = segments.as_slice();
            match rest.first().map(String::as_str) {
                Some("crate") => {
                    resolved.clear();
                    rest = &rest[1..];
                }
                Some("super" | "self") => {
                    while let Some(first) = rest.first() {
                        match first.as_str() {
                            "super" => {
                                resolved.pop();
                            }
                            "self" => {}
                            _ => break,
                        }
                        rest = &rest[1..];
                    }
                }
                _ => {} // a local module: relative to here
            }
            resolved.extend(rest.iter().filter(|s| *s != "self").cloned());
            paths.push((line + 1, resolved));
        }
        i = stop.max(end);
    }
    Source {
        file: relative,
        module,
        children,
        paths,
    }
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

/// The library's sources, without the files compiled for tests only.
fn library() -> Vec<Source> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    let all: Vec<Source> = files.iter().map(|f| read_source(&src, f)).collect();
    let test_modules: BTreeSet<Vec<String>> = all
        .iter()
        .flat_map(|s| {
            s.children
                .iter()
                .filter(|(_, test)| *test)
                .map(|(name, _)| s.module.iter().cloned().chain([name.clone()]).collect())
        })
        .collect();
    all.into_iter()
        .filter(|s| {
            !test_modules
                .iter()
                .any(|t| s.module.len() >= t.len() && s.module[..t.len()] == t[..])
        })
        .collect()
}

/// The file that defines the longest prefix of `path` (a module, or an item of one).
fn file_of<'s>(modules: &BTreeMap<Vec<String>, &'s Source>, path: &[String]) -> Option<&'s Source> {
    (0..=path.len())
        .rev()
        .find_map(|k| modules.get(&path[..k]).copied())
}

/// Checks each row names only rows above it, and returns the rows' order.
fn order_of<'t>(
    rows: &'t [(String, BTreeSet<String>)],
    wrong: &mut Vec<String>,
) -> BTreeMap<&'t str, usize> {
    let order: BTreeMap<&str, usize> = rows
        .iter()
        .enumerate()
        .map(|(i, (name, _))| (name.as_str(), i))
        .collect();
    for (i, (name, uses)) in rows.iter().enumerate() {
        for used in uses {
            if order.get(used.as_str()).is_none_or(|&at| at >= i) {
                wrong.push(format!("the row of `{name}` names `{used}`, not above it"));
            }
        }
    }
    order
}

#[test]
fn every_module_reaches_only_the_modules_its_row_names() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let design = std::fs::read_to_string(root.join("DESIGN.md")).expect("DESIGN.md");
    let rows = table(&design, "| module | owns | uses |");
    assert!(rows.len() > 10, "the layer table is read: {rows:?}");
    let mut wrong = Vec::new();
    let order = order_of(&rows, &mut wrong);
    for source in library() {
        let Some(module) = source.module.first() else {
            continue; // lib.rs, the table of contents: it declares every module
        };
        let Some(&row) = order.get(module.as_str()) else {
            wrong.push(format!(
                "{}: module `{module}` has no row",
                source.file.display()
            ));
            continue;
        };
        for (line, path) in &source.paths {
            let Some(used) = path.first() else { continue };
            if used != module && !rows[row].1.contains(used) {
                wrong.push(format!(
                    "{}:{line}: `crate::{}` is not in the row of `{module}`",
                    source.file.display(),
                    path.join("::")
                ));
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn every_wing_of_the_pool_reaches_only_the_wings_its_row_names() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let design = std::fs::read_to_string(root.join("DESIGN.md")).expect("DESIGN.md");
    let rows = table(&design, "| wing | owns | uses |");
    assert!(rows.len() > 6, "the pool's wing table is read: {rows:?}");
    let mut wrong = Vec::new();
    let order = order_of(&rows, &mut wrong);
    let library = library();
    let wings: BTreeSet<&str> = library
        .iter()
        .filter(|s| s.module.len() >= 2 && s.module[0] == "pool")
        .map(|s| s.module[1].as_str())
        .collect();
    // A path inside the pool reaches the wing it names, or the face (`mod.rs`) for an item
    // named through it.
    let wing_of = |path: &[String]| -> Option<String> {
        match path {
            [first, second, ..] if first == "pool" && wings.contains(second.as_str()) => {
                Some(second.clone())
            }
            [first, ..] if first == "pool" => Some("mod.rs".to_string()),
            _ => None,
        }
    };
    for source in library
        .iter()
        .filter(|s| s.module.first().is_some_and(|m| m == "pool"))
    {
        let wing = wing_of(&source.module).expect("a file of the pool");
        let Some(&row) = order.get(wing.as_str()) else {
            wrong.push(format!(
                "{}: wing `{wing}` has no row",
                source.file.display()
            ));
            continue;
        };
        for (line, path) in &source.paths {
            let Some(used) = wing_of(path) else { continue };
            if used != wing && !rows[row].1.contains(&used) {
                wrong.push(format!(
                    "{}:{line}: `crate::{}` reaches `{used}`, not in the row of `{wing}`",
                    source.file.display(),
                    path.join("::")
                ));
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// The files that import each other in a loop: each strongly connected set of more than
/// one file of `edges` (Tarjan's algorithm).
fn circles(edges: &BTreeMap<String, BTreeSet<String>>) -> Vec<BTreeSet<String>> {
    struct Walk<'e> {
        edges: &'e BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'e str, (usize, usize)>, // node: (index, lowest link)
        stack: Vec<&'e str>,
        found: Vec<BTreeSet<String>>,
    }
    impl<'e> Walk<'e> {
        fn visit(&mut self, node: &'e str) {
            let at = self.index.len();
            self.index.insert(node, (at, at));
            self.stack.push(node);
            for next in self.edges.get(node).into_iter().flatten() {
                let next = next.as_str();
                match self.index.get(next).copied() {
                    None => {
                        self.visit(next);
                        let low = self.index[next].1;
                        let entry = self.index.get_mut(node).expect("visited");
                        entry.1 = entry.1.min(low);
                    }
                    Some((index, _)) if self.stack.contains(&next) => {
                        let entry = self.index.get_mut(node).expect("visited");
                        entry.1 = entry.1.min(index);
                    }
                    Some(_) => {}
                }
            }
            if self.index[node].0 == self.index[node].1 {
                let mut set = BTreeSet::new();
                while let Some(top) = self.stack.pop() {
                    set.insert(top.to_string());
                    if top == node {
                        break;
                    }
                }
                if set.len() > 1 {
                    self.found.push(set);
                }
            }
        }
    }
    let mut walk = Walk {
        edges,
        index: BTreeMap::new(),
        stack: Vec::new(),
        found: Vec::new(),
    };
    for node in edges.keys() {
        if !walk.index.contains_key(node.as_str()) {
            walk.visit(node);
        }
    }
    walk.found
}

#[test]
fn no_files_of_the_pool_or_the_arena_import_each_other_in_a_circle() {
    let library = library();
    let modules: BTreeMap<Vec<String>, &Source> =
        library.iter().map(|s| (s.module.clone(), s)).collect();
    let checked = |s: &Source| {
        s.module
            .first()
            .is_some_and(|m| m == "pool" || m == "arena")
    };
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for source in library.iter().filter(|s| checked(s)) {
        let from = source.file.display().to_string();
        let entry = edges.entry(from.clone()).or_default();
        for (_, path) in &source.paths {
            if let Some(target) = file_of(&modules, path).filter(|t| checked(t)) {
                let to = target.file.display().to_string();
                if to != from {
                    entry.insert(to);
                }
            }
        }
    }
    assert!(edges.len() > 50, "the sources are read: {}", edges.len());
    let found = circles(&edges);
    assert!(
        found.is_empty(),
        "files that import each other in a circle:\n{}",
        found
            .iter()
            .map(|set| set.iter().cloned().collect::<Vec<_>>().join(" <-> "))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

/// The reader finds what it must, so that the checks above cannot pass by reading nothing.
#[test]
fn the_reader_resolves_every_path_form() {
    let dir = std::env::temp_dir().join(format!("layers-{}", std::process::id()));
    let src = dir.join("src");
    std::fs::create_dir_all(src.join("pool/engine")).unwrap();
    let file = src.join("pool/engine/inner.rs");
    std::fs::write(
        &file,
        "use super::super::class;\n\
         use super::{cache::Entry, lists};\n\
         use crate::{sync::Arc, pool::{observe::books::Books, PoolBuffer}};\n\
         use self::local::Thing;\n\
         use own::Child;\n\
         mod own;\n\
         // use crate::commented::Out;\n\
         /// [`x`](crate::doc::Link)\n\
         pub(in crate::pool) fn f() { let s = \"crate::string::Not\"; crate::thread::g(); }\n\
         fn g<'a>(x: &'a u8) -> char { other_crate::x(); 'c' }\n\
         mod local {\n    use super::super::drain;\n}\n\
         #[cfg(all(test, not(loom)))]\n\
         mod tests {\n    use crate::tested::Only;\n}\n",
    )
    .unwrap();
    let source = read_source(&src, &file);
    std::fs::remove_dir_all(&dir).unwrap();
    let found: BTreeSet<String> = source.paths.iter().map(|(_, p)| p.join("::")).collect();
    let expected: BTreeSet<String> = [
        "pool::class",
        "pool::engine::cache::Entry",
        "pool::engine::lists",
        "sync::Arc",
        "pool::observe::books::Books",
        "pool::PoolBuffer",
        "pool::engine::inner::local::Thing",
        "pool::engine::inner::own::Child",
        "thread::g",
        "pool::engine::drain",
    ]
    .into_iter()
    .map(String::from)
    .collect();
    assert_eq!(found, expected);
    assert_eq!(source.module, ["pool", "engine", "inner"]);
    assert_eq!(source.children, [("own".to_string(), false)]);
    let rows = table(
        "| module | owns | uses |\n|---|---|---|\n| `a` | x | |\n| `b` | y | `a`, `sync` |\n\nafter",
        "| module | owns | uses |",
    );
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[1].0, "b");
    assert_eq!(
        rows[1].1,
        BTreeSet::from(["a".to_string(), "sync".to_string()])
    );
    let edges: BTreeMap<String, BTreeSet<String>> = [
        ("a", vec!["b"]),
        ("b", vec!["c"]),
        ("c", vec!["a", "d"]),
        ("d", vec![]),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.into_iter().map(String::from).collect()))
    .collect();
    assert_eq!(
        circles(&edges),
        [BTreeSet::from(["a", "b", "c"].map(String::from))]
    );
}
