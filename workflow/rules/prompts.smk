# Prompts stage: pinned public prompt sets -> one parquet of chat-templated, tokenized prompts per domain.


for _set, _spec in config["prompt_sources"].items():

    rule:
        name:
            f"fetch_prompt_source_{_set}"
        output:
            f"resources/prompt_sources/{source_file_name(_set, _spec)}",
        params:
            spec=_spec,
            download_dir="resources/prompt_sources/archives",
        conda:
            SPECDEC_ENV
        log:
            f"logs/prompt_sources/{_set}.log",
        script:
            "../scripts/fetch_prompt_source.py"


rule make_prompts:
    input:
        unpack(prompt_inputs),
    output:
        f"{R}/prompts/{{domain}}.parquet",
    params:
        domain_spec=lambda wc: config["domains"][wc.domain],
        prompt_sources=lambda wc: prompt_sources_of({wc.domain: config["domains"][wc.domain]}),
        n=config["prompts"]["per_domain"],
        seed=config["prompts"]["seed"],
        max_prompt_tokens=config["prompts"]["max_prompt_tokens"],
        use_chat_template=config["prompts"]["use_chat_template"],
        system_prompt=config["prompts"]["system_prompt"],
    conda:
        SPECDEC_ENV
    log:
        f"{LOG}/prompts/{{domain}}.log",
    script:
        "../scripts/make_prompts.py"
