//! Built-in tools: the two search tools (one type over any [`mtrl_search::Retriever`]) and
//! `submit`, the final answer. One file per tool.

mod search;
mod submit;

pub use search::{IndexRetriever, SearchTool};
pub use submit::{clean_ids, SubmitTool};
