//! The composition root: the context every actor shares (the runtime's part and each domain's) and the
//! wiring of every domain's feeds, actors and taps into one actor tree on top of the runtime. It holds no
//! rules and no actor of its own.

pub mod actor_tree;
pub mod context;
