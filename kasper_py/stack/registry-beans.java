package io.kasperpy.stack;

import io.apicurio.common.apps.config.DynamicConfigPropertyList;
import javax.enterprise.context.ApplicationScoped;
import javax.enterprise.inject.Produces;

/** Stands in for the synthetic bean of Apicurio's config-index build extension. */
@ApplicationScoped
public class ConfigPropertyListProducer {
    @Produces
    @ApplicationScoped
    DynamicConfigPropertyList dynamicConfigPropertyList() {
        return new DynamicConfigPropertyList(new java.util.ArrayList<>());
    }
}
