//! Checkpoint chains: persistent linked lists of (graph, alias, retained inputs), newest first.
//!
//! Generic over the graph type `G`, the input key `K` and the alias target `A`, which belong
//! to the runtime's graph crate. The collectors keep the runtime's semantics exactly: they walk
//! from the head to older nodes and overwrite on insert, so when a key repeats along a chain
//! the entry of the **oldest** node wins.

use std::collections::HashMap;
use std::fmt;
use std::hash::Hash;
use std::panic::{self, AssertUnwindSafe};

use crate::retain::{RetainedInputMap, RetainedValue};
use crate::sync::Arc;

/// One checkpoint: a graph, the alias it introduces, the inputs it retained, and the older
/// part of the chain.
///
/// Dropping a chain never recurses, whatever its length.
///
/// ```
/// use std::sync::Arc;
/// use ferropool::{CheckpointNode, RetainedInputMap};
/// let node: CheckpointNode<&str, &str, u32> = CheckpointNode {
///     graph: Arc::new("segment 0"),
///     alias_key: "x",
///     alias_target: 0,
///     old_inputs: Arc::new(RetainedInputMap::new()),
///     prev: None,
/// };
/// assert_eq!(node.depth(), 1);
/// ```
pub struct CheckpointNode<G, K, A> {
    /// The checkpointed graph.
    pub graph: Arc<G>,
    /// The input key the alias binds.
    pub alias_key: K,
    /// What the alias points at in the graph.
    pub alias_target: A,
    /// Inputs retained for replay.
    pub old_inputs: Arc<RetainedInputMap<K>>,
    /// The older part of the chain.
    pub prev: Option<Arc<CheckpointNode<G, K, A>>>,
}

impl<G, K: Clone, A: Clone> Clone for CheckpointNode<G, K, A> {
    fn clone(&self) -> Self {
        Self {
            graph: Arc::clone(&self.graph),
            alias_key: self.alias_key.clone(),
            alias_target: self.alias_target.clone(),
            old_inputs: Arc::clone(&self.old_inputs),
            prev: self.prev.clone(),
        }
    }
}

impl<G, K: fmt::Debug, A: fmt::Debug> fmt::Debug for CheckpointNode<G, K, A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CheckpointNode")
            .field("alias_key", &self.alias_key)
            .field("alias_target", &self.alias_target)
            .field("old_inputs_len", &self.old_inputs.len())
            .field("has_prev", &self.prev.is_some())
            .finish_non_exhaustive()
    }
}

impl<G, K, A> Drop for CheckpointNode<G, K, A> {
    /// Unlinks the older nodes iteratively: each node this one owned alone is dropped with
    /// its `prev` already taken, so no drop recurses. A node someone else still holds ends
    /// the walk. If the drop of a node's graph, key, target or inputs panics, the walk goes
    /// on (every node is dropped once) and the first panic is resumed at the end; this
    /// node's own fields are then dropped while unwinding, as usual.
    fn drop(&mut self) {
        let mut first_panic = None;
        let mut next = self.prev.take();
        while let Some(node) = next {
            match Arc::try_unwrap(node) {
                Ok(mut node) => {
                    next = node.prev.take();
                    if let Err(payload) = panic::catch_unwind(AssertUnwindSafe(|| drop(node))) {
                        first_panic.get_or_insert(payload);
                    }
                }
                Err(_) => break,
            }
        }
        if let Some(payload) = first_panic {
            if !std::thread::panicking() {
                panic::resume_unwind(payload);
            }
        }
    }
}

impl<G, K, A> CheckpointNode<G, K, A> {
    /// A new node on top of the chain `prev` (the newest node first, as the collectors
    /// walk).
    ///
    /// ```
    /// use std::sync::Arc;
    /// use ferropool::{CheckpointNode, RetainedInputMap};
    /// let chain = CheckpointNode::push(
    ///     None,
    ///     Arc::new("segment 0"),
    ///     "x",
    ///     0u32,
    ///     Arc::new(RetainedInputMap::new()),
    /// );
    /// let chain = CheckpointNode::push(
    ///     Some(chain),
    ///     Arc::new("segment 1"),
    ///     "y",
    ///     1u32,
    ///     Arc::new(RetainedInputMap::new()),
    /// );
    /// assert_eq!(chain.depth(), 2);
    /// assert_eq!(chain.lookup_alias(&"x"), Some(&0));
    /// ```
    pub fn push(
        prev: Option<Arc<Self>>,
        graph: Arc<G>,
        alias_key: K,
        alias_target: A,
        old_inputs: Arc<RetainedInputMap<K>>,
    ) -> Arc<Self> {
        Arc::new(Self {
            graph,
            alias_key,
            alias_target,
            old_inputs,
            prev,
        })
    }

    /// Drops the newest node of a chain and returns the older part: a backward pass that
    /// walks the chain newest first gives each segment's inputs back as soon as it is done
    /// with them. If another handle still holds the node, the node stays for it (and its
    /// inputs with it); the older part is returned either way.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use ferropool::{CheckpointNode, RetainedInputMap};
    /// let inputs = Arc::new(RetainedInputMap::new());
    /// let old = CheckpointNode::push(None, Arc::new("g0"), "x", 0u32, inputs.clone());
    /// let head = CheckpointNode::push(Some(old), Arc::new("g1"), "y", 1u32, inputs.clone());
    /// let rest = CheckpointNode::pop(head).expect("the older node");
    /// assert_eq!(rest.alias_key, "x");
    /// assert_eq!(Arc::strong_count(&inputs), 2); // the popped node's inputs went with it
    /// assert!(CheckpointNode::pop(rest).is_none());
    /// ```
    pub fn pop(head: Arc<Self>) -> Option<Arc<Self>> {
        match Arc::try_unwrap(head) {
            // The node drops here with its `prev` taken: nothing older goes with it.
            Ok(mut node) => node.prev.take(),
            Err(shared) => shared.prev.clone(),
        }
    }

    /// The nodes from this one to the oldest.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use ferropool::{CheckpointNode, RetainedInputMap};
    /// let inputs = Arc::new(RetainedInputMap::new());
    /// let old = CheckpointNode::push(None, Arc::new("g0"), "x", 0u32, inputs.clone());
    /// let head = CheckpointNode::push(Some(old), Arc::new("g1"), "y", 1u32, inputs);
    /// let keys: Vec<&str> = head.iter().map(|node| node.alias_key).collect();
    /// assert_eq!(keys, ["y", "x"]); // newest first
    /// ```
    pub fn iter(&self) -> impl Iterator<Item = &Self> {
        std::iter::successors(Some(self), |node| node.prev.as_deref())
    }

    /// Nodes in the chain from this one.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use ferropool::{CheckpointNode, RetainedInputMap};
    /// let inputs = Arc::new(RetainedInputMap::new());
    /// let chain = CheckpointNode::push(None, Arc::new("g0"), "x", 0u32, inputs.clone());
    /// let chain = CheckpointNode::push(Some(chain), Arc::new("g1"), "y", 1u32, inputs);
    /// assert_eq!(chain.depth(), 2);
    /// ```
    pub fn depth(&self) -> usize {
        self.iter().count()
    }

    /// Every graph, head first (the runtime's order).
    ///
    /// ```
    /// use std::sync::Arc;
    /// use ferropool::{CheckpointNode, RetainedInputMap};
    /// let inputs = Arc::new(RetainedInputMap::new());
    /// let old = CheckpointNode::push(None, Arc::new("g0"), "x", 0u32, inputs.clone());
    /// let head = CheckpointNode::push(Some(old), Arc::new("g1"), "y", 1u32, inputs);
    /// let graphs: Vec<&str> = head.collect_graphs().iter().map(|graph| **graph).collect();
    /// assert_eq!(graphs, ["g1", "g0"]);
    /// ```
    pub fn collect_graphs(&self) -> Vec<Arc<G>> {
        self.iter().map(|node| Arc::clone(&node.graph)).collect()
    }
}

impl<G, K: Eq + Hash + Clone, A: Clone> CheckpointNode<G, K, A> {
    /// Every alias of the chain; for a key bound by several nodes, the oldest node's target.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use ferropool::{CheckpointNode, RetainedInputMap};
    /// let inputs = Arc::new(RetainedInputMap::new());
    /// let old = CheckpointNode::push(None, Arc::new("g0"), "x", 0u32, inputs.clone());
    /// let head = CheckpointNode::push(Some(old), Arc::new("g1"), "x", 1u32, inputs);
    /// let aliases = head.collect_aliases();
    /// assert_eq!(aliases.len(), 1);
    /// assert_eq!(aliases["x"], 0); // the oldest node's target wins
    /// ```
    pub fn collect_aliases(&self) -> HashMap<K, A> {
        let mut aliases = HashMap::new();
        for node in self.iter() {
            aliases.insert(node.alias_key.clone(), node.alias_target.clone());
        }
        aliases
    }

    /// Every retained input of the chain; for a key retained by several nodes, the oldest
    /// node's value. (Sizing the map for every entry up front was measured slower: keys
    /// repeat along real chains, so it over-allocates.)
    ///
    /// ```
    /// use std::sync::Arc;
    /// use ferropool::{CheckpointNode, RetainedInputMap, RetainedValue, Tensor};
    /// let saved = |x: f32| -> ferropool::Result<_> {
    ///     Ok(Arc::new(RetainedValue::from_tensor(Tensor::from_slice(&[x], &[1])?)))
    /// };
    /// let old = Arc::new(RetainedInputMap::from([("a", saved(1.0)?)]));
    /// let new = Arc::new(RetainedInputMap::from([("a", saved(2.0)?)]));
    /// let chain = CheckpointNode::push(None, Arc::new("g0"), "x", 0u32, old);
    /// let chain = CheckpointNode::push(Some(chain), Arc::new("g1"), "y", 1u32, new);
    /// let inputs = chain.collect_inputs();
    /// assert_eq!(inputs["a"].tensor_read()?.get::<f32>(&[0])?, 1.0); // the oldest value wins
    /// # Ok::<(), ferropool::Error>(())
    /// ```
    pub fn collect_inputs(&self) -> RetainedInputMap<K> {
        let mut inputs = HashMap::new();
        for node in self.iter() {
            inputs.extend(
                node.old_inputs
                    .iter()
                    .map(|(key, value)| (key.clone(), Arc::clone(value))),
            );
        }
        inputs
    }

    /// The alias target `collect_aliases()` would give for `key`, without building a map.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use ferropool::{CheckpointNode, RetainedInputMap};
    /// let inputs = Arc::new(RetainedInputMap::new());
    /// let old = CheckpointNode::push(None, Arc::new("g0"), "x", 0u32, inputs.clone());
    /// let head = CheckpointNode::push(Some(old), Arc::new("g1"), "x", 1u32, inputs);
    /// assert_eq!(head.lookup_alias(&"x"), Some(&0)); // as `collect_aliases()["x"]`
    /// assert_eq!(head.lookup_alias(&"y"), None);
    /// ```
    pub fn lookup_alias(&self, key: &K) -> Option<&A> {
        self.iter()
            .filter(|node| node.alias_key == *key)
            .last()
            .map(|node| &node.alias_target)
    }

    /// The input `collect_inputs()` would give for `key`, without building a map.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use ferropool::{CheckpointNode, RetainedInputMap, RetainedValue, Tensor};
    /// let x = Arc::new(RetainedValue::from_tensor(Tensor::from_slice(&[4.0f32], &[1])?));
    /// let inputs = Arc::new(RetainedInputMap::from([("x", x)]));
    /// let chain = CheckpointNode::push(None, Arc::new("g0"), "x", 0u32, inputs);
    /// assert_eq!(chain.lookup_input(&"x").map(|value| value.shape()), Some(&[1][..]));
    /// assert!(chain.lookup_input(&"y").is_none());
    /// # Ok::<(), ferropool::Error>(())
    /// ```
    pub fn lookup_input(&self, key: &K) -> Option<&Arc<RetainedValue>> {
        self.iter()
            .filter_map(|node| node.old_inputs.get(key))
            .last()
    }

    /// Merges two chains into one: the lhs nodes, in order, on top of the rhs chain, so that
    /// the collectors traverse both sides (the runtime's semantics).
    ///
    /// Where the lhs spine is owned only by the caller, it is relinked in place, with no
    /// allocation; from the first node shared with someone else, the rest of the lhs is
    /// copied node by node (a plain persistent list copies all of it).
    ///
    /// ```
    /// use std::sync::Arc;
    /// use ferropool::{CheckpointNode, RetainedInputMap};
    /// let inputs = Arc::new(RetainedInputMap::new());
    /// let rhs = CheckpointNode::push(None, Arc::new("r0"), "x", 0u32, inputs.clone());
    /// let lhs = CheckpointNode::push(None, Arc::new("l0"), "x", 1u32, inputs);
    /// let merged = CheckpointNode::merge_chains(Some(lhs), Some(rhs)).expect("two chains");
    /// let graphs: Vec<&str> = merged.collect_graphs().iter().map(|graph| **graph).collect();
    /// assert_eq!(graphs, ["l0", "r0"]);
    /// assert_eq!(merged.lookup_alias(&"x"), Some(&0)); // rhs is older: its alias wins
    /// ```
    pub fn merge_chains(lhs: Option<Arc<Self>>, rhs: Option<Arc<Self>>) -> Option<Arc<Self>> {
        let (mut head, rhs) = match (lhs, rhs) {
            (None, rhs) => return rhs,
            (lhs, None) => return lhs,
            (Some(lhs), Some(rhs)) => (lhs, rhs),
        };
        let mut cursor = &mut head;
        loop {
            if Arc::get_mut(cursor).is_none() {
                let copied = Self::copy_onto(cursor, rhs);
                *cursor = copied;
                break;
            }
            let node = Arc::get_mut(cursor).expect("checked unique above");
            match node.prev {
                None => {
                    node.prev = Some(rhs);
                    break;
                }
                Some(ref mut older) => cursor = older,
            }
        }
        Some(head)
    }

    /// The reference rebuild: copies of `lhs`'s nodes, in order, on top of `rhs`.
    fn copy_onto(lhs: &Self, rhs: Arc<Self>) -> Arc<Self> {
        let spine: Vec<&Self> = lhs.iter().collect();
        let mut prev = rhs;
        for node in spine.into_iter().rev() {
            prev = Arc::new(Self {
                graph: Arc::clone(&node.graph),
                alias_key: node.alias_key.clone(),
                alias_target: node.alias_target.clone(),
                old_inputs: Arc::clone(&node.old_inputs),
                prev: Some(prev),
            });
        }
        prev
    }
}
