// Package cellmap is kvindex's cell map: which cell (an independent
// kvindex stack: a Kafka topic, an ingester group, an etcd cluster and its
// indexd replicas) serves each model, shared by the routers (client) and
// the producers (kvindex bridge --cell-map).
//
// # File format
//
// The map is one JSON document (JSON is also YAML, so a ConfigMap may
// hold it as is):
//
//	{
//	  "cells": [
//	    {"name": "a", "indexd": "dns:///indexd.kvindex-a:50051", "topic": "kvindex-a"},
//	    {"name": "b", "indexd": "dns:///indexd.kvindex-b:50051", "topic": "kvindex-b",
//	     "brokers": ["kafka-b:9092"]}
//	  ],
//	  "models": [
//	    {"match": "llama-70b", "cells": ["a", "b"]},
//	    {"match": "qwen-*", "cells": ["b"]},
//	    {"match": "mistral-7b", "cells": ["b"], "readAlso": ["a"]}
//	  ],
//	  "default": "a"
//	}
//
// A cell has a name (1-63 of [a-z0-9-], starting and ending alphanumeric,
// as a Kubernetes name label), its indexd target (any client.New target),
// its Kafka topic and optionally its own seed brokers (default: the
// producer's --brokers).
//
// A model rule's match is an exact model name or a glob: "*" matches any
// run of characters (slashes included: model names such as
// "meta-llama/Llama-3.1-8B" have them), "?" one character; there are no
// character classes. A model takes the rule of its exact name, else the
// first glob in file order that matches, else the default cell; without a
// default an unmatched model has no cell (ErrNoCell).
//
// A rule's cells are where its producers write. One cell: the whole model
// lives there. K cells: the model is spread, each pod in the one cell
// PodCell picks by rendezvous hashing of the pod identity (the Kafka record
// key), so a pod's records, all its data-parallel ranks, and so its blocks,
// are in exactly one cell, and growing K from 2 to 3 moves a third of the
// pods, not two thirds. readAlso lists cells routers read too while the
// model moves between cells (docs/DESIGN.md "Moving a model"): producers
// never write there.
//
// # Validation
//
// Parse is strict: unknown fields, duplicate cell names, topics or exact
// model rules, a rule naming an unknown cell or a cell twice, an empty
// match or cell list, and a default naming no cell are errors wrapping
// ErrInvalid, each naming the line of the offending entry.
//
// # Watching
//
// Watcher re-reads the file every interval and swaps in the new map when
// its bytes change and it parses; a bad file is logged and counted, and the
// last good map stays. Reading the path (not watching inodes) follows a
// ConfigMap volume's atomic "..data" symlink swap like any other change.
package cellmap
