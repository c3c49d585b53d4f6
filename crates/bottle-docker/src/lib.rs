//! `bottle-docker` is the docker backend. It talks to the Docker Engine API
//! (bollard) and never shells out to the `docker` CLI.
