//! `hf-hub`'s sync [`ApiRepo`] accepted where files are fetched (`hub` feature): a Candle
//! program passes the handle it already holds, and missing files come from the endpoint that
//! handle names, into the cache of the [`HubFiles`].
//!
//! The handle says where to download from, not how: `hf-hub` 0.5's `ApiRepo::download` has no
//! timeouts and writes paths named by the server unchecked, so the bytes are moved by
//! `hub/download.rs` (timeouts, checked names, confined paths). What `hf-hub` 0.5 does not
//! expose is not taken from the handle: its cache folder (the [`HubFiles`]' cache is used; build
//! both from the same folder), its token (see [`HubFiles::with_token`]), its retries and
//! progress bar.

use super::HubFiles;
use crate::error::Result;
use hf_hub::api::sync::ApiRepo;
use std::path::PathBuf;

impl HubFiles {
    /// The endpoint `api` downloads from (`https://huggingface.co`, or what `HF_ENDPOINT` /
    /// `ApiBuilder::with_endpoint` set). An error when `api` is for another repository or
    /// revision than this [`HubFiles`] (the URL it builds is compared with the one expected).
    pub fn endpoint_of(&self, api: &ApiRepo) -> Result<String> {
        let url = api.url("");
        let repo = self.repo();
        let tail = format!("/{}/resolve/{}/", repo.url(), repo.url_revision());
        match url.strip_suffix(&tail).filter(|e| !e.is_empty()) {
            Some(endpoint) => Ok(endpoint.to_string()),
            None => Err(self.error(
                "",
                format!(
                    "the ApiRepo given is not for this repository and revision: its URLs are {url:?}, expected \
                     a URL ending in {tail:?} (build both from the same `hf_hub::Repo`)"
                ),
            )),
        }
    }

    /// `file` (under the subfolder) from the cache, else (unless `HF_HUB_OFFLINE`) downloaded
    /// from `api`'s endpoint into the cache. The path returned lies inside the cache.
    ///
    /// ```no_run
    /// use unet_parity::hub::{cache_dir, hf_hub, HubFiles};
    /// use hf_hub::{api::sync::ApiBuilder, Cache, Repo};
    ///
    /// let cache = Cache::new(cache_dir(None));
    /// let api = ApiBuilder::from_cache(cache.clone()).build()?;
    /// let repo = Repo::model("stable-diffusion-v1-5/stable-diffusion-v1-5".into());
    /// let files = HubFiles::new(repo.clone(), cache)?.with_subfolder("unet")?;
    /// let config = files.get(&api.repo(repo), "config.json")?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn get(&self, api: &ApiRepo, file: &str) -> Result<PathBuf> {
        // Checked first: a handle for another repository is a mistake even when the file is cached.
        let endpoint = self.endpoint_of(api)?;
        self.get_or_download(file, false, || Ok(endpoint))
    }

    /// `config.json` and the first of [`super::WEIGHT_FILES`] the repository has (cached files first),
    /// downloading what is missing through `api` as [`HubFiles::get`] does.
    pub fn model_files(&self, api: &ApiRepo) -> Result<(PathBuf, PathBuf)> {
        let endpoint = self.endpoint_of(api)?;
        self.model_files_with(|file| self.get_or_download(file, false, || Ok(endpoint.clone())))
    }
}
